//! One run of the lab: a fresh copy of the seeded database, the API (or the canned refusal)
//! started pinned with the variant's settings, the load lab's commands for the run's load, the
//! fault when the run has one, the samples beside it, and the server stopped.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use breakwater_loadlab::report::Report;
use sqlx::postgres::PgPoolOptions;
use tokio::io::AsyncBufReadExt as _;

use super::dataset::TokenSet;
use super::faults::{Slowdown, Slowed, Slowing};
use super::probes::{Sampler, health};
use super::progress::log;
use crate::plan::Plan;
use crate::record::PhaseRun;
use crate::rig::pinned::{Limits, Millicores, Pinned};
use crate::rig::services;

/// The progress lines of a run's first load lab command (its stderr).
type Lines = tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStderr>>;

/// The API's CPU quota and memory limit: the production task (Fargate 256 CPU units, 512 MiB).
pub(crate) const MEMORY: u64 = 512 << 20;

/// Which throttles the API runs with.
#[derive(Debug, Clone, Copy)]
pub(super) enum Throttles {
    /// Off: the admission comparison is not confounded by per-tenant limits.
    Off,
    /// On, per tenant at the API's default; per IP and per user set out of reach (all load comes
    /// from one address, and each tenant's traffic from a few users).
    Tenants,
    /// On, every limit out of reach but the flooding tenant's own (its plan, set in the database).
    Flood,
}

/// What drives a run.
pub(super) enum Load {
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
pub(super) enum Server {
    Api,
    /// The canned refusal: a bare hyper server's 503, the floor of a refusal's cost.
    Floor,
}

/// One run.
pub(super) struct Spec<'a> {
    pub(super) variant: &'a str,
    pub(super) phase: &'a str,
    pub(super) server: Server,
    pub(super) throttles: Throttles,
    pub(super) load: Load,
    pub(super) slowdown: Option<Slowdown>,
}

impl<'a> Spec<'a> {
    /// The API with `variant`, throttles off, no slowdown.
    pub(super) fn api(variant: &'a str, phase: &'a str, load: Load) -> Self {
        Self { variant, phase, server: Server::Api, throttles: Throttles::Off, load, slowdown: None }
    }
}

/// The API's environment at the production task's size (the CloudFormation stack's 256-512
/// tier): one runtime thread and the accept rate it sets there.
pub(super) const PRODUCTION_TIER: [(&str, &str); 2] = [("TOKIO_WORKER_THREADS", "1"), ("MAX_ACCEPT_RATE", "2000")];

pub(super) struct Ctx {
    /// The seeded database each run's copy is made from.
    pub(super) template: String,
    pub(super) bin: PathBuf,
    pub(super) db_url: String,
    pub(super) server: String,
    pub(super) runs: PathBuf,
    pub(super) port: u16,
    pub(super) plan: Plan,
    pub(super) tokens: TokenSet,
    /// Whether the API runs pinned (always, except a quick run on a host without cgroups).
    pub(super) pin: bool,
    /// The API's CPU quota when pinned.
    pub(super) cpus: Millicores,
}

impl Ctx {
    /// (Re)creates the served database as a copy of the seeded `template`.
    pub(super) async fn fresh_copy(&self, template: &str) -> anyhow::Result<()> {
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

    pub(super) fn base(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The API's ops listener, on the port after the public one.
    pub(super) fn ops_base(&self) -> String {
        format!("http://127.0.0.1:{}", self.port + 1)
    }

    /// A profile run with the weighted tokens, not honouring `Retry-After`.
    pub(super) fn profile(&self, name: &'static str, capacity: Option<f64>) -> Load {
        Load::Profile { name, capacity, tokens: self.tokens.path.clone(), honour: false }
    }

    /// The load lab's command for one load: its arguments, the sampling and the output.
    pub(super) fn loadlab(&self, load: &Load, server: Server, pid: u32, out: &Path) -> Vec<tokio::process::Command> {
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
    pub(super) async fn phase(&self, spec: Spec<'_>) -> anyhow::Result<PhaseRun> {
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
        let mut cmd = self.server_command(&name, variant, server, throttles, &load, pinned.as_ref())?;
        let mut api = cmd.spawn().context("starting the server")?;
        let pid = api.id().context("the server exited at once")?;
        wait_healthy(self.port, &mut api).await?;

        let sampler = Sampler::start(
            self.port,
            &self.server,
            &self.db_url,
            pinned.as_ref(),
            Duration::from_millis(self.plan.sample_interval_ms),
        )
        .await;
        let out = self.runs.join(format!("{name}.json"));
        let (children, lines) = self.spawn_loads(&name, &load, server, pid, &out)?;
        let (step_ends, mut slowing, mut slowed) = self.follow(lines, &sampler, slowdown).await?;
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

    /// The server's command for a run: the API with the variant's settings at the production
    /// tier (or the canned refusal), pinned when it can be, logging to the runs directory.
    fn server_command(
        &self,
        name: &str,
        variant: &str,
        server: Server,
        throttles: Throttles,
        load: &Load,
        pinned: Option<&Pinned>,
    ) -> anyhow::Result<tokio::process::Command> {
        let argv: Vec<std::ffi::OsString> = match server {
            Server::Api => vec![self.bin.join("breakwater-api").into(), "serve".into()],
            Server::Floor => vec![self.bin.join("examples/canned_refusal").into(), self.port.to_string().into()],
        };
        let mut cmd = match pinned {
            Some(p) => p.command(&argv)?,
            None => {
                let mut c = tokio::process::Command::new(&argv[0]);
                c.args(&argv[1..]).process_group(0);
                c
            }
        };
        let api_log = std::fs::File::create(self.runs.join(format!("{name}.api.log")))?;
        cmd.envs(PRODUCTION_TIER)
            .envs(self.plan.api_env.iter().filter_map(|e| e.split_once('=')))
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
        Ok(cmd)
    }

    /// Starts the load lab's commands for `load`: the first one's progress lines are returned to
    /// follow, the others' go to files.
    fn spawn_loads(
        &self,
        name: &str,
        load: &Load,
        server: Server,
        pid: u32,
        out: &Path,
    ) -> anyhow::Result<(Vec<tokio::process::Child>, Lines)> {
        let mut children = Vec::new();
        let mut lines = None;
        for (i, mut ll) in self.loadlab(load, server, pid, out).into_iter().enumerate() {
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
        Ok((children, lines.context("no load")?))
    }

    /// Echoes the load lab's progress lines until it ends, noting when each step ended; in the
    /// capacity-change run, slows PostgreSQL down after the first step and recovers it after the
    /// second. Returns the step ends, a slowdown still in force, and what a finished one did.
    async fn follow(
        &self,
        mut lines: Lines,
        sampler: &Sampler,
        slowdown: Option<Slowdown>,
    ) -> anyhow::Result<(Vec<f64>, Option<Slowing>, Option<Slowed>)> {
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
                    slowing = Some(Slowing::start(&self.server, &self.db_url, how).await?);
                } else if step_ends.len() == 2
                    && let Some(running) = slowing.take()
                {
                    slowed = Some(running.stop().await);
                }
            }
        }
        Ok((step_ends, slowing, slowed))
    }

    /// The flood's tenant (the heaviest) gets a plan of `rate` requests a second, as much burst,
    /// in the served copy: the API reads the plans at start.
    pub(super) async fn flood_plan(&self, rate: f64) -> anyhow::Result<()> {
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
pub(super) async fn wait_healthy(port: u16, api: &mut tokio::process::Child) -> anyhow::Result<()> {
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

/// SIGTERM, a few seconds' grace, then SIGKILL.
pub(super) async fn stop(api: &mut tokio::process::Child, pid: u32) {
    if let Some(p) = i32::try_from(pid).ok().and_then(rustix::process::Pid::from_raw) {
        let _ = rustix::process::kill_process(p, rustix::process::Signal::TERM);
    }
    if tokio::time::timeout(Duration::from_secs(8), api.wait()).await.is_err() {
        let _ = api.kill().await;
    }
}
