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
//! Refusals (a refused connection, 503 `load_shed`, 429) are counted as refusals, not errors.

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;
use uuid::Uuid;

use crate::rig::services::{self, Cluster};

mod hostile_tenant;

/// Options of `cargo xtask chaos`.
#[derive(Debug, clap::Args)]
pub struct ChaosArgs {
    /// Shorter runs and a shorter fuzzing budget (about 5 minutes in all). CI runs it with
    /// `--only postgres,redis,sigterm,fuzz`.
    #[arg(long)]
    quick: bool,
    /// Only these scenarios (comma-separated: postgres, redis, sigterm, hostile, fuzz).
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

/// One checked expectation.
#[derive(Debug)]
struct Check {
    scenario: &'static str,
    what: String,
    expected: String,
    measured: String,
    ok: bool,
}

#[derive(Debug, Default)]
struct Report {
    checks: Vec<Check>,
    notes: Vec<String>,
}

impl Report {
    fn check(&mut self, scenario: &'static str, what: &str, expected: &str, measured: String, ok: bool) {
        println!("  [{}] {what}: expected {expected}; measured {measured}", if ok { "ok" } else { "FAIL" });
        self.checks.push(Check { scenario, what: what.into(), expected: expected.into(), measured, ok });
    }

    fn note(&mut self, text: String) {
        println!("  note: {text}");
        self.notes.push(text);
    }
}

const SECRET: &str = "chaos-suite-secret-chaos-suite-secret-0123456789";

/// The private servers, the binaries and the data every scenario shares.
struct Lab {
    dir: PathBuf,
    pg: Cluster,
    redis_port: u16,
    redis: Option<Child>,
    bin: PathBuf,
    db_url: String,
    prefix: String,
    tenants: Vec<TenantData>,
    /// A tenant apart, whose agent attacks in the `hostile-tenant` scenario.
    attacker: TenantData,
    quick: bool,
}

/// A tenant's token and the conversations the load writes to.
#[derive(Debug, Clone)]
struct TenantData {
    tenant: Uuid,
    user: Uuid,
    token: String,
    conversations: Vec<Uuid>,
}

/// A running API process.
struct Api {
    child: Child,
    port: u16,
    /// The ops listener's port (`/ready`, `/metrics`, `/v1/ops/status`).
    ops_port: u16,
    log: PathBuf,
    /// The process whose memory is sampled (the API itself, also when it runs under `pinned`).
    pid: u32,
}

impl Api {
    fn base(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn ops_base(&self) -> String {
        format!("http://127.0.0.1:{}", self.ops_port)
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        if let Some(mut r) = self.redis.take() {
            let _ = r.kill();
            let _ = r.wait();
        }
        let _ = self.pg.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
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

    let mut lab = Lab::start(bin, args.quick).await?;
    let mut report = Report::default();
    println!(
        "chaos: private PostgreSQL on port {}, private Redis on port {}, {} build",
        lab.pg.port,
        lab.redis_port,
        if args.release { "release" } else { "debug" }
    );

    let port = free_port()?;
    // Every request read is logged (for the SIGTERM scenario's accounting; see `read_request_ids`).
    let mut api = lab.spawn_api(port, &[("RUST_LOG", READ_LOG)], false)?;
    wait_healthy(&api.base(), Duration::from_secs(20)).await?;
    let capacity = lab.capacity(&api.base()).await?;
    let rate = (capacity * 0.5).clamp(10.0, 400.0);
    report.note(format!(
        "capacity (closed loop, 16 clients, 50/50 POST message / GET inbox, 3 s): {capacity:.0} req/s; \
         scenarios run at {rate:.0} req/s"
    ));

    if wanted("postgres") {
        println!("\n== postgres: cluster stopped and started under load");
        postgres_restart(&mut lab, &api, rate, &mut report).await?;
    }
    if wanted("redis") {
        println!("\n== redis: killed and restarted under load");
        redis_kill(&mut lab, &api, rate, &mut report).await?;
    }
    if wanted("sigterm") {
        println!("\n== sigterm: drain under load, a new process on the same port");
        api = sigterm(&lab, api, rate, &mut report).await?;
    }
    if wanted("hostile-tenant") {
        println!("\n== hostile-tenant: one agent stalls bodies, reads slowly, forges tokens; ops paths probed");
        hostile_tenant::run(&lab, args.release, &mut report).await?;
    }
    if wanted("hostile") {
        println!("\n== hostile: slowloris, idle keep-alives, oversized input, a connection flood");
        stop_api(&mut api);
        report_panics(&api, "api", &mut report);
        let port = free_port()?;
        api = hostile(&lab, port, args.accept_rate, &mut report).await?;
    }
    if wanted("fuzz") {
        println!("\n== fuzz: schemathesis against /openapi.json, two tenants");
        fuzz(&lab, &api, &mut report).await?;
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

impl Lab {
    async fn start(bin: PathBuf, quick: bool) -> anyhow::Result<Self> {
        let dir = std::env::temp_dir().join(format!("breakwater-chaos-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        let pg = Cluster::new(dir.join("pgdata"), free_port()?)?;
        pg.init()?;
        pg.start()?;
        let db_url = pg.url("breakwater");
        let redis_port = free_port()?;
        let mut lab = Self {
            dir,
            pg,
            redis_port,
            redis: None,
            bin,
            db_url,
            prefix: format!("chaos-{}", Uuid::now_v7()),
            tenants: Vec::new(),
            attacker: TenantData {
                tenant: Uuid::nil(),
                user: Uuid::nil(),
                token: String::new(),
                conversations: Vec::new(),
            },
            quick,
        };
        lab.start_redis()?;
        services::create_database(&lab.db_url).await?;
        let pool = sqlx::postgres::PgPoolOptions::new().max_connections(2).connect(&lab.db_url).await?;
        breakwater_domain::migrate(&pool).await.context("migrating")?;
        for name in ["Chaos A", "Chaos B"] {
            lab.tenants.push(make_tenant(&pool, &lab.bin, name, "admin").await?);
        }
        lab.attacker = make_tenant(&pool, &lab.bin, "Chaos Attacker", "agent").await?;
        pool.close().await;
        Ok(lab)
    }

    fn start_redis(&mut self) -> anyhow::Result<()> {
        let log = std::fs::File::create(self.dir.join("redis.log"))?;
        let child = Command::new("redis-server")
            .args(["--port", &self.redis_port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .stdout(log)
            .stderr(Stdio::null())
            .spawn()
            .context("redis-server (install Redis: apt-get install redis-server)")?;
        self.redis = Some(child);
        let deadline = Instant::now() + Duration::from_secs(5);
        while std::net::TcpStream::connect(("127.0.0.1", self.redis_port)).is_err() {
            anyhow::ensure!(Instant::now() < deadline, "redis-server did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }

    fn kill_redis(&mut self) {
        if let Some(mut r) = self.redis.take() {
            let _ = r.kill();
            let _ = r.wait();
        }
    }

    /// Starts the API on `port`, logging JSON to a file; under `cargo xtask pinned` when asked.
    fn spawn_api(&self, port: u16, env: &[(&str, &str)], pinned: bool) -> anyhow::Result<Api> {
        let log = self.dir.join(format!("api-{port}-{}.log", Uuid::now_v7()));
        let api = self.bin.join("breakwater-api");
        let ops_port = free_port()?;
        let mut cmd = if pinned {
            let mut c = Command::new(std::env::current_exe()?);
            c.arg("pinned").arg("--").arg(&api);
            c
        } else {
            Command::new(&api)
        };
        cmd.arg("serve")
            .env("DATABASE_URL", &self.db_url)
            .env("REDIS_URL", format!("redis://127.0.0.1:{}", self.redis_port))
            .env("BIND_ADDR", format!("127.0.0.1:{port}"))
            .env("OPS_ADDR", format!("127.0.0.1:{ops_port}"))
            .env("APP_ENV", "production")
            .env("JWT_SECRET", SECRET)
            .env("LOG_FORMAT", "json")
            .env("RUST_LOG", "info")
            .env("THROTTLE_KEY_PREFIX", &self.prefix)
            // The abuse ceilings stay out of the way of a half-capacity load from two users.
            .env("THROTTLE_TENANT_RATE", "100000")
            .env("THROTTLE_TENANT_BURST", "100000")
            .env("THROTTLE_USER_RATE", "100000")
            .env("THROTTLE_USER_BURST", "100000")
            .env("THROTTLE_IP_RATE", "1000000")
            .env("THROTTLE_IP_BURST", "1000000")
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&log)?)
            .stderr(std::fs::File::options().append(true).open(&log)?);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let child = cmd.spawn().context("starting breakwater-api")?;
        let pid = child.id();
        Ok(Api { child, port, ops_port, log, pid })
    }

    /// Closed-loop throughput of the load mix: what "half of capacity" is measured against.
    async fn capacity(&self, base: &str) -> anyhow::Result<f64> {
        let client = client()?;
        let until = Instant::now() + Duration::from_secs(3);
        let mut tasks = Vec::new();
        for w in 0..16usize {
            let (client, base, tenants) = (client.clone(), base.to_owned(), self.tenants.clone());
            tasks.push(tokio::spawn(async move {
                let mut ok = 0u64;
                let mut i = w;
                while Instant::now() < until {
                    if let Outcome::Status { status, .. } = send(&client, &base, &tenants, "capacity", i).await.1
                        && (200..300).contains(&status)
                    {
                        ok += 1;
                    }
                    i += 16;
                }
                ok
            }));
        }
        let mut total = 0u64;
        for t in tasks {
            total += t.await?;
        }
        Ok(f64::from(u32::try_from(total).unwrap_or(u32::MAX)) / 3.0)
    }
}

/// A tenant with eight open conversations, and a token of its user with `role`.
async fn make_tenant(pool: &sqlx::PgPool, bin: &Path, name: &str, role: &str) -> anyhow::Result<TenantData> {
    use breakwater_domain::contacts::{self, NewContact};
    use breakwater_domain::conversations::{self, ConversationStatus, NewConversation};
    use breakwater_domain::tenants::{self, Role};
    let tenant = tenants::create_tenant(pool, name).await?;
    let user = tenants::create_user(pool, tenant, "Chaos Admin", "admin@chaos.example", Role::Admin).await?;
    let inbox = tenants::create_inbox(pool, tenant, "Web", "web", None).await?;
    let mut conversations = Vec::new();
    for i in 0..8 {
        let contact = contacts::create(
            pool,
            tenant,
            NewContact { name: format!("Contact {i}"), email: Some(format!("c{i}@chaos.example")) },
        )
        .await?;
        let conv = conversations::create(
            pool,
            tenant,
            NewConversation {
                contact_id: contact.id,
                inbox_id: inbox,
                assignee_id: None,
                status: ConversationStatus::Open,
            },
        )
        .await?;
        conversations.push(conv.id);
    }
    let out = Command::new(bin.join("breakwater-api"))
        .args(["token", "--tenant", &tenant.to_string(), "--user", &user.to_string(), "--role", role])
        .env("JWT_SECRET", SECRET)
        .output()?;
    anyhow::ensure!(out.status.success(), "minting a token failed");
    Ok(TenantData {
        tenant: tenant.0,
        user: user.0,
        token: String::from_utf8(out.stdout)?.trim().to_owned(),
        conversations,
    })
}

fn client() -> anyhow::Result<reqwest::Client> {
    Ok(reqwest::Client::builder()
        .timeout(Duration::from_secs(20))
        .connect_timeout(Duration::from_secs(2))
        .pool_max_idle_per_host(64)
        .build()?)
}

/// What one request got.
#[derive(Debug, Clone)]
enum Outcome {
    /// A complete response.
    Status { status: u16, code: Option<String>, created: Option<Uuid> },
    /// The connection was refused (a refusal: nothing was accepted).
    Refused,
    /// Anything else: a reset, a truncated body, a timeout.
    Failed(String),
}

/// The `x-request-id` of request `i` of a run; a posted message's body is the same text, so a
/// request can be found both in the API's log and in the table.
fn request_id(run: &str, i: usize) -> String {
    format!("chaos-{run}-{i}")
}

/// Whether request `i` of the load mix posts a message (even `i`); odd `i` reads an inbox page.
fn posts(i: usize) -> bool {
    i.is_multiple_of(2)
}

/// One request of the load mix: even `i` posts a message, odd `i` reads an inbox page.
async fn send(
    client: &reqwest::Client,
    base: &str,
    tenants: &[TenantData],
    run: &str,
    i: usize,
) -> (Duration, Outcome) {
    let t = &tenants[i / 2 % tenants.len()];
    let id = request_id(run, i);
    let started = Instant::now();
    let req = if posts(i) {
        let conv = t.conversations[i / 4 % t.conversations.len()];
        client
            .post(format!("{base}/v1/conversations/{conv}/messages"))
            .bearer_auth(&t.token)
            .json(&json!({ "body": id }))
    } else {
        client.get(format!("{base}/v1/conversations?limit=10")).bearer_auth(&t.token)
    };
    let req = req.header("x-request-id", &id);
    let outcome = match req.send().await {
        Err(e) if e.is_connect() => Outcome::Refused,
        Err(e) => Outcome::Failed(format!("{e:?}")),
        Ok(res) => {
            let status = res.status().as_u16();
            match res.text().await {
                Err(e) => Outcome::Failed(format!("body: {e:?}")),
                Ok(text) => {
                    let body: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
                    let code = body["error"]["code"].as_str().map(str::to_owned);
                    let created = if status == 201 { body["id"].as_str().and_then(|s| s.parse().ok()) } else { None };
                    Outcome::Status { status, code, created }
                }
            }
        }
    };
    (started.elapsed(), outcome)
}

impl Sample {
    fn is_2xx(&self) -> bool {
        matches!(self.outcome, Outcome::Status { status: 200..=299, .. })
    }
}

/// A request of an open-loop run: when it was sent (since the run began), how long it took,
/// and what it got.
#[derive(Debug, Clone)]
struct Sample {
    /// The request's number in its run (see [`request_id`]).
    i: usize,
    at: Duration,
    took: Duration,
    outcome: Outcome,
}

/// Open-loop load at `rate` for `duration`: requests are sent on schedule whether or not the
/// earlier ones have answered (so a stall shows as latency, not as a slower sender).
fn open_loop(
    run: &'static str,
    base: String,
    tenants: Vec<TenantData>,
    rate: f64,
    duration: Duration,
    t0: Instant,
) -> tokio::task::JoinHandle<Vec<Sample>> {
    tokio::spawn(async move {
        let Ok(client) = client() else { return Vec::new() };
        let interval = Duration::from_secs_f64(1.0 / rate);
        let mut tasks = Vec::new();
        let mut i = 0usize;
        let mut next = Instant::now();
        let end = Instant::now() + duration;
        while next < end {
            tokio::time::sleep_until(next.into()).await;
            let (client, base, tenants) = (client.clone(), base.clone(), tenants.clone());
            let at = t0.elapsed();
            tasks.push(tokio::spawn(async move {
                let (took, outcome) = send(&client, &base, &tenants, run, i).await;
                Sample { i, at, took, outcome }
            }));
            i += 1;
            next += interval;
        }
        let mut out = Vec::new();
        for t in tasks {
            if let Ok(s) = t.await {
                out.push(s);
            }
        }
        out
    })
}

/// 503s that say the database (or the handler's deadline) failed the request.
const TYPED_503: &[&str] = &["db_unavailable", "db_saturated", "request_timeout"];
/// 503s of admission control: refusals under overload, by design.
const SHED_503: &[&str] = &["load_shed", "queue_timeout"];

/// Counts of a run's outcomes.
#[derive(Debug, Default)]
struct Tally {
    ok: usize,
    typed_503: usize,
    shed: usize,
    throttled: usize,
    other_4xx: usize,
    server_errors: usize,
    refused: usize,
    failed: usize,
    first_failure: Option<String>,
    codes: BTreeMap<String, usize>,
}

impl Tally {
    /// Deliberate refusals: typed 503s (database, deadline), admission's 503s and 429s.
    fn refusals(&self) -> usize {
        self.typed_503 + self.shed + self.throttled
    }
}

fn tally<'a>(samples: impl IntoIterator<Item = &'a Sample>) -> Tally {
    let mut t = Tally::default();
    for s in samples {
        match &s.outcome {
            Outcome::Status { status, code, .. } => {
                if let Some(c) = code {
                    *t.codes.entry(format!("{status} {c}")).or_default() += 1;
                }
                match *status {
                    200..=299 => t.ok += 1,
                    429 => t.throttled += 1,
                    503 if code.as_deref().is_some_and(|c| TYPED_503.contains(&c)) => t.typed_503 += 1,
                    503 if code.as_deref().is_some_and(|c| SHED_503.contains(&c)) => t.shed += 1,
                    400..=499 => t.other_4xx += 1,
                    _ => t.server_errors += 1,
                }
            }
            Outcome::Refused => t.refused += 1,
            Outcome::Failed(e) => {
                t.failed += 1;
                t.first_failure.get_or_insert_with(|| e.clone());
            }
        }
    }
    t
}

fn describe(t: &Tally) -> String {
    let mut s = format!(
        "{} ok, {} typed 503 (database/deadline), {} shed 503 (admission), {} 429, {} other 4xx, {} other 5xx, \
         {} refused, {} failed",
        t.ok, t.typed_503, t.shed, t.throttled, t.other_4xx, t.server_errors, t.refused, t.failed
    );
    if !t.codes.is_empty() {
        s.push_str(&format!(" (codes: {:?})", t.codes));
    }
    if let Some(f) = &t.first_failure {
        s.push_str(&format!("; first failure: {}", f.chars().take(200).collect::<String>()));
    }
    s
}

/// The nearest-rank `p`th percentile (`p` in whole percent).
fn percentile(mut v: Vec<Duration>, p: usize) -> Duration {
    if v.is_empty() {
        return Duration::ZERO;
    }
    v.sort_unstable();
    v[(v.len() * p).div_ceil(100).clamp(1, v.len()) - 1]
}

/// `part` of `whole`, 0 when `whole` is 0.
fn share(part: usize, whole: usize) -> f64 {
    if whole == 0 { 0.0 } else { part as f64 / whole as f64 }
}

fn ms(d: Duration) -> String {
    format!("{:.0} ms", d.as_secs_f64() * 1000.0)
}

async fn wait_healthy(base: &str, within: Duration) -> anyhow::Result<Duration> {
    let client = reqwest::Client::builder().timeout(Duration::from_millis(500)).build()?;
    let started = Instant::now();
    loop {
        if let Ok(r) = client.get(format!("{base}/health")).send().await
            && r.status().is_success()
        {
            return Ok(started.elapsed());
        }
        anyhow::ensure!(started.elapsed() < within, "the API did not answer /health within {within:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn terminate(child: &Child) -> anyhow::Result<()> {
    let pid = i32::try_from(child.id()).ok().and_then(rustix::process::Pid::from_raw).context("a child's pid")?;
    rustix::process::kill_process(pid, rustix::process::Signal::TERM)?;
    Ok(())
}

fn stop_api(api: &mut Api) {
    if matches!(api.child.try_wait(), Ok(None)) {
        let _ = terminate(&api.child);
        let deadline = Instant::now() + Duration::from_secs(30);
        while matches!(api.child.try_wait(), Ok(None)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = api.child.kill();
    }
    let _ = api.child.wait();
}

fn report_panics(api: &Api, scenario: &'static str, report: &mut Report) {
    let log = std::fs::read_to_string(&api.log).unwrap_or_default();
    let panics = log.lines().filter(|l| l.contains("panicked")).count();
    let what = format!("panics in the API log (pid {}, port {})", api.pid, api.port);
    report.check(scenario, &what, "0", panics.to_string(), panics == 0);
}

// ---------------------------------------------------------------------------------------------
// PostgreSQL stopped and started under load.

async fn postgres_restart(lab: &mut Lab, api: &Api, rate: f64, report: &mut Report) -> anyhow::Result<()> {
    const S: &str = "postgres";
    let duration = Duration::from_secs(if lab.quick { 20 } else { 30 });
    let t0 = Instant::now();
    let load = open_loop("postgres", api.base(), lab.tenants.clone(), rate, duration, t0);
    tokio::time::sleep(duration / 4).await;
    let down_from = t0.elapsed();
    lab.pg.stop()?;
    let stopped_at = t0.elapsed();
    tokio::time::sleep(duration * 3 / 10).await;
    let restart_at = t0.elapsed();
    lab.pg.start()?;
    let up_at = t0.elapsed();
    println!(
        "  stop issued at {:.1} s (stopped at {:.1} s), start issued at {:.1} s, accepting at {:.1} s",
        down_from.as_secs_f64(),
        stopped_at.as_secs_f64(),
        restart_at.as_secs_f64(),
        up_at.as_secs_f64()
    );
    let samples = load.await?;
    let all = tally(&samples);
    report.note(format!(
        "postgres run: {} requests at {rate:.0} req/s over {} s: {}",
        samples.len(),
        duration.as_secs(),
        describe(&all)
    ));
    report.check(
        S,
        "5xx other than a typed 503, and transport failures",
        "0",
        format!("{} 5xx, {} failed", all.server_errors, all.failed),
        all.server_errors == 0 && all.failed == 0,
    );

    let down: Vec<&Sample> = samples.iter().filter(|s| s.at >= stopped_at && s.at < restart_at).collect();
    let down_tally = tally(down.iter().copied());
    // Admission's refusals to a caller that came back before its `Retry-After` are held until
    // then by design (the caller pays in its own time, docs/ADMISSION.md), for at most the
    // pacer's cap: they are bounded by the cap past the same 2 s, everything else by 2 s.
    let is_shed =
        |s: &Sample| matches!(&s.outcome, Outcome::Status { code: Some(c), .. } if SHED_503.contains(&c.as_str()));
    let longest = |shed: bool| down.iter().filter(|s| is_shed(s) == shed).map(|s| s.took).max().unwrap_or_default();
    let (down_max, shed_max) = (longest(false), longest(true));
    let down_p99 = percentile(down.iter().map(|s| s.took).collect(), 99);
    let pacing = pacing_status(api).await;
    let max_hold = Duration::from_secs_f64(pacing.map_or(0.0, |p| p.0) / 1000.0);
    // A 2xx "while down" can only be a request that waited for the database to come back (the
    // pool keeps trying to connect until its acquire timeout): when were they sent, and answered?
    let ok_down: Vec<String> = down
        .iter()
        .filter(|s| s.is_2xx())
        .map(|s| {
            format!(
                "sent {:+.0} ms, answered {:+.0} ms",
                (s.at.as_secs_f64() - restart_at.as_secs_f64()) * 1000.0,
                ((s.at + s.took).as_secs_f64() - up_at.as_secs_f64()) * 1000.0
            )
        })
        .collect();
    if !ok_down.is_empty() {
        report.note(format!(
            "postgres: 2xx to requests sent while it was down (relative to the start issued, and to it accepting): {}",
            ok_down.join("; ")
        ));
    }
    report.check(
        S,
        "while down: typed 503s",
        "every non-2xx a typed 503 (db_* or admission's load_shed/queue_timeout)",
        format!("{} requests: {}", down.len(), describe(&down_tally)),
        down_tally.typed_503 + down_tally.shed > 0
            && down_tally.ok + down_tally.typed_503 + down_tally.shed == down.len(),
    );
    report.check(
        S,
        "while down: answered quickly",
        &format!(
            "max < 2000 ms (no 15 s hangs); admission's refusals held for early callers < 2000 ms + the pacer's cap ({})",
            ms(max_hold)
        ),
        format!(
            "p99 {}; max {} (admission's refusals: {}; {} refusals held since start)",
            ms(down_p99),
            ms(down_max),
            ms(shed_max),
            pacing.map_or_else(|| "-".to_owned(), |p| p.1.to_string())
        ),
        pacing.is_some() && down_max < Duration::from_secs(2) && shed_max < Duration::from_secs(2) + max_hold,
    );

    // "Serves normally" is judged against the same run before the fault: the same load, the same
    // process. From 5 s after the return: no database error at all, no 5xx or transport failure
    // (the first check), and admission refusing no larger a share than before the stop (at least
    // 1% is allowed, the lab's bound for a step within capacity: an adaptive limit refuses the odd
    // request in a latency spike at any load, fault or not).
    let before_stop: Vec<&Sample> = samples.iter().filter(|s| s.at < down_from).collect();
    let before_n = before_stop.len();
    let before = tally(before_stop.iter().copied());
    let before_refused = share(before.refusals(), before_n);
    let after: Vec<&Sample> = samples.iter().filter(|s| s.at >= up_at).collect();
    // What the tail after the return is made of, second by second, so a slow recovery can be
    // told apart: admission's limit climbing back (shed), the pool reconnecting (db_*), or both.
    let mut by_second: BTreeMap<u64, Vec<&Sample>> = BTreeMap::new();
    for s in &after {
        by_second.entry(s.at.saturating_sub(up_at).as_secs()).or_default().push(s);
    }
    let timeline: Vec<String> = by_second
        .iter()
        .filter(|(second, s)| **second < 6 || s.iter().any(|s| !s.is_2xx()))
        .map(|(second, s)| {
            let t = tally(s.iter().copied());
            format!("+{second} s: {} of {} 2xx {:?}", t.ok, s.len(), t.codes)
        })
        .collect();
    report.note(format!(
        "postgres before the stop: {before_n} requests, {}; after its return: {}",
        describe(&before),
        timeline.join("; ")
    ));
    let last_db_error = after
        .iter()
        .filter(|s| matches!(&s.outcome, Outcome::Status { status: 503, code: Some(c), .. } if TYPED_503.contains(&c.as_str())))
        .map(|s| s.at.saturating_sub(up_at))
        .max();
    report.check(
        S,
        "the database serves again within 5 s of its return, no API restart",
        "no typed database 503 (db_*, request_timeout) sent 5 s or more after",
        last_db_error.map_or("none after the return".into(), |t| format!("last one sent {} after", ms(t))),
        last_db_error.is_none_or(|t| t < Duration::from_secs(5)),
    );
    let settled: Vec<&Sample> = after.iter().copied().filter(|s| s.at >= up_at + Duration::from_secs(5)).collect();
    let settled_tally = tally(settled.iter().copied());
    let settled_refused = share(settled_tally.refusals(), settled.len());
    let allowed = before_refused.max(0.01);
    let last_bad = after.iter().filter(|s| !s.is_2xx()).map(|s| s.at.saturating_sub(up_at)).max();
    report.check(
        S,
        "from 5 s after the return, refusals no more than before the stop",
        "refused share <= the share before the stop, or 1% if that was lower; nothing else but 2xx",
        format!(
            "{} requests: {:.2}% refused (before the stop: {:.2}%), {} not 2xx in all{}",
            settled.len(),
            settled_refused * 100.0,
            before_refused * 100.0,
            settled.len() - settled_tally.ok,
            last_bad.map_or(String::new(), |t| format!("; last non-2xx after the return sent {} after", ms(t)))
        ),
        !settled.is_empty()
            && settled_refused <= allowed
            && settled_tally.ok + settled_tally.shed + settled_tally.throttled == settled.len(),
    );

    let created: Vec<Uuid> = samples
        .iter()
        .filter_map(|s| match &s.outcome {
            Outcome::Status { created: Some(id), .. } => Some(*id),
            _ => None,
        })
        .collect();
    let pool = sqlx::postgres::PgPoolOptions::new().max_connections(1).connect(&lab.db_url).await?;
    let found: i64 =
        sqlx::query_scalar("SELECT count(*) FROM messages WHERE id = ANY($1)").bind(&created).fetch_one(&pool).await?;
    pool.close().await;
    report.check(
        S,
        "no accepted message lost",
        "every 201's message in the table",
        format!("{found} of {} found", created.len()),
        usize::try_from(found).ok() == Some(created.len()) && !created.is_empty(),
    );
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Redis killed and restarted under load.

/// The pacer's cap on a hold (ms) and its held refusals since start, from `/v1/ops/status`.
async fn pacing_status(api: &Api) -> Option<(f64, u64)> {
    let client = reqwest::Client::builder().timeout(Duration::from_secs(2)).build().ok()?;
    let r = client.get(format!("{}/v1/ops/status", api.ops_base())).send().await.ok()?;
    let v: Value = r.json().await.ok()?;
    let p = &v["layers"]["retry_pacing"];
    Some((p["max_hold_ms"].as_f64()?, p["held_total"].as_u64()?))
}

async fn throttle_state(client: &reqwest::Client, ops: &str) -> Option<String> {
    let r = client.get(format!("{ops}/v1/ops/status")).send().await.ok()?;
    let v: Value = r.json().await.ok()?;
    v["layers"]["throttles"]["state"].as_str().map(str::to_owned)
}

async fn redis_kill(lab: &mut Lab, api: &Api, rate: f64, report: &mut Report) -> anyhow::Result<()> {
    const S: &str = "redis";
    let duration = Duration::from_secs(if lab.quick { 15 } else { 24 });
    let t0 = Instant::now();
    let load = open_loop("redis", api.base(), lab.tenants.clone(), rate, duration, t0);
    let poller = {
        let ops = api.ops_base();
        tokio::spawn(async move {
            let client = reqwest::Client::builder().timeout(Duration::from_secs(2)).build().ok()?;
            let mut states = Vec::new();
            while t0.elapsed() < duration {
                states.push((t0.elapsed(), throttle_state(&client, &ops).await));
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Some(states)
        })
    };
    tokio::time::sleep(duration / 4).await;
    // The fault goes into a known state: under load on a slow machine one Redis call over its
    // budget opens the breaker for a moment by itself (the polls before the kill count those).
    // Wait up to 2 s for the throttles to read `ok`, then kill at once.
    let client = reqwest::Client::builder().timeout(Duration::from_secs(2)).build()?;
    let ok_by = Instant::now() + Duration::from_secs(2);
    let mut before_ok = throttle_state(&client, &api.ops_base()).await.as_deref() == Some("ok");
    while !before_ok && Instant::now() < ok_by {
        tokio::time::sleep(Duration::from_millis(20)).await;
        before_ok = throttle_state(&client, &api.ops_base()).await.as_deref() == Some("ok");
    }
    let killed_at = t0.elapsed();
    lab.kill_redis();
    tokio::time::sleep(duration * 3 / 10).await;
    let restarted_at = t0.elapsed();
    lab.start_redis()?;
    let samples = load.await?;
    let states = poller.await?.context("status poller")?;
    let all = tally(&samples);
    report.note(format!("redis run: {} requests at {rate:.0} req/s: {}", samples.len(), describe(&all)));
    report.check(
        S,
        "no 5xx, no transport failures (admission's shed 503s are refusals, counted apart)",
        "0",
        format!(
            "{} 5xx ({} typed database 503s), {} failed; {} shed by admission",
            all.server_errors + all.typed_503,
            all.typed_503,
            all.failed,
            all.shed
        ),
        all.server_errors == 0 && all.typed_503 == 0 && all.failed == 0,
    );
    let mut seen_before: BTreeMap<String, usize> = BTreeMap::new();
    for (_, st) in states.iter().filter(|(t, _)| *t < killed_at) {
        *seen_before.entry(st.clone().unwrap_or_else(|| "no answer".into())).or_default() += 1;
    }
    let degraded = states
        .iter()
        .find(|(t, s)| *t >= killed_at && *t < restarted_at && s.as_deref() == Some("degraded"))
        .map(|(t, _)| t.saturating_sub(killed_at));
    report.check(
        S,
        "throttles degrade to in-process (ops/status layers.throttles.state)",
        "ok when killed, degraded within 3 s of the kill",
        format!(
            "polls before the kill {seen_before:?}; ok when killed: {before_ok}; degraded after {}",
            degraded.map_or("never".into(), ms)
        ),
        before_ok && degraded.is_some_and(|d| d <= Duration::from_secs(3)),
    );
    let recovered = states
        .iter()
        .find(|(t, s)| *t >= restarted_at && s.as_deref() == Some("ok"))
        .map(|(t, _)| t.saturating_sub(restarted_at));
    report.check(
        S,
        "throttles come back to Redis",
        "ok within 5 s of the restart",
        format!("ok after {}", recovered.map_or("never".into(), ms)),
        recovered.is_some_and(|d| d <= Duration::from_secs(5)),
    );
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// SIGTERM under load.

async fn sigterm(lab: &Lab, mut api: Api, rate: f64, report: &mut Report) -> anyhow::Result<Api> {
    const S: &str = "sigterm";
    let duration = Duration::from_secs(14);
    let t0 = Instant::now();
    let load = open_loop("sigterm", api.base(), lab.tenants.clone(), rate, duration, t0);
    // Readiness and the listener, probed on a new connection each time (as a load balancer does).
    let prober = {
        let ops = api.ops_base();
        tokio::spawn(async move {
            let client =
                reqwest::Client::builder().timeout(Duration::from_secs(2)).pool_max_idle_per_host(0).build().ok()?;
            let mut seen = Vec::new();
            while t0.elapsed() < duration {
                let at = t0.elapsed();
                let got = match client.get(format!("{ops}/ready")).send().await {
                    Ok(r) => r.status().as_u16().to_string(),
                    Err(e) if e.is_connect() => "refused".to_owned(),
                    Err(e) => format!("error {e}"),
                };
                seen.push((at, got));
                tokio::time::sleep(Duration::from_millis(25)).await;
            }
            Some(seen)
        })
    };
    tokio::time::sleep(Duration::from_secs(3)).await;
    let term_at = t0.elapsed();
    terminate(&api.child)?;
    // Wait for the listener to close, then start the new process on the same port at once.
    let port = api.port;
    let closed_at = loop {
        if std::net::TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), Duration::from_millis(200)).is_err() {
            break t0.elapsed();
        }
        anyhow::ensure!(t0.elapsed() < term_at + Duration::from_secs(30), "the listener never closed");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let spawned_at = t0.elapsed();
    let new_api = lab.spawn_api(port, &[("RUST_LOG", READ_LOG)], false)?;
    let serving = wait_healthy(&new_api.base(), Duration::from_secs(20)).await;
    let exit = loop {
        if let Some(status) = api.child.try_wait()? {
            break Some((t0.elapsed(), status));
        }
        if t0.elapsed() > term_at + Duration::from_secs(40) {
            break None;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let samples = load.await?;
    let probes = prober.await?.context("prober")?;
    let all = tally(&samples);
    report.note(format!("sigterm run: {} requests at {rate:.0} req/s: {}", samples.len(), describe(&all)));

    let not_ready_at = probes.iter().find(|(t, g)| *t >= term_at && g != "200").map(|(t, g)| (*t, g.clone()));
    report.check(
        S,
        "readiness turns false before the listener closes",
        "/ready 503 after SIGTERM, before connections are refused",
        format!(
            "/ready {} at +{}; listener closed at +{}",
            not_ready_at.as_ref().map_or("-", |(_, g)| g.as_str()),
            not_ready_at.as_ref().map_or("never".into(), |(t, _)| ms(t.saturating_sub(term_at))),
            ms(closed_at.saturating_sub(term_at))
        ),
        not_ready_at.as_ref().is_some_and(|(t, g)| g == "503" && *t < closed_at),
    );
    // A failed request was accepted if a process read it: its log has the event the accept loop
    // logs as hyper hands a request to the app (at debug, enabled for both processes; either may
    // have read a request sent around the handover). One never read was not accepted: the HTTP/1.1
    // race where the server closes an idle kept-alive connection as the client sends on it
    // (RFC 9112, section 9.3.1). Such a POST must not be in the table.
    let mut read = read_request_ids(&api.log);
    read.extend(read_request_ids(&new_api.log));
    let before_term: Vec<&Sample> = samples.iter().filter(|s| s.at < term_at && s.is_2xx()).collect();
    let unlogged = before_term.iter().filter(|s| !read.contains(&request_id("sigterm", s.i))).count();
    report.check(
        S,
        "the old process logs every request it reads (this check's instrument)",
        "every 2xx sent before SIGTERM is in the log",
        format!("{} of {} found", before_term.len() - unlogged, before_term.len()),
        !before_term.is_empty() && unlogged == 0,
    );
    let failed: Vec<&Sample> = samples.iter().filter(|s| matches!(s.outcome, Outcome::Failed(_))).collect();
    let (accepted, unread): (Vec<&Sample>, Vec<&Sample>) =
        failed.iter().partition(|s| read.contains(&request_id("sigterm", s.i)));
    let unread_posts: Vec<String> = unread.iter().filter(|s| posts(s.i)).map(|s| request_id("sigterm", s.i)).collect();
    let pool = sqlx::postgres::PgPoolOptions::new().max_connections(1).connect(&lab.db_url).await?;
    let stored: i64 = sqlx::query_scalar("SELECT count(*) FROM messages WHERE body = ANY($1)")
        .bind(&unread_posts)
        .fetch_one(&pool)
        .await?;
    pool.close().await;
    let when: Vec<String> = failed
        .iter()
        .map(|s| {
            let sent = s.at.as_secs_f64() - term_at.as_secs_f64();
            let what = if let Outcome::Failed(e) = &s.outcome { e.chars().take(160).collect() } else { String::new() };
            format!("{} sent at {sent:+.3} s from SIGTERM: {what}", request_id("sigterm", s.i))
        })
        .collect();
    if !when.is_empty() {
        report.note(format!("sigterm failures: {}", when.join("; ")));
    }
    report.check(
        S,
        "every accepted request gets a complete response",
        "0 resets or truncated responses to a request the server read; 0 5xx; refusals allowed",
        format!(
            "{} failed: {} read by the server, {} never read (closed as it arrived; {} of them POSTs, {stored} of \
             those stored); {} refused, {} 5xx",
            failed.len(),
            accepted.len(),
            unread.len(),
            unread_posts.len(),
            all.refused,
            all.server_errors
        ),
        accepted.is_empty() && stored == 0 && all.server_errors == 0,
    );
    report.check(
        S,
        "the old process exits cleanly within the grace period",
        "exit 0 within 30 s of SIGTERM",
        exit.map_or("still running after 40 s".into(), |(t, st)| {
            format!("{st} after {}", ms(t.saturating_sub(term_at)))
        }),
        exit.is_some_and(|(t, st)| st.success() && t.saturating_sub(term_at) < Duration::from_secs(30)),
    );
    let serve_ms = serving.as_ref().map_or_else(|e| format!("{e}"), |d| ms(*d));
    report.check(
        S,
        "a new process on the same port serves at once",
        "/health 200 within 5 s of its start",
        format!("{serve_ms} (started {} after the listener closed)", ms(spawned_at.saturating_sub(closed_at))),
        serving.is_ok_and(|d| d <= Duration::from_secs(5)),
    );
    report_panics(&api, S, report);
    Ok(new_api)
}

/// The API's log filter when the requests it reads are accounted for (see `read_request_ids`).
const READ_LOG: &str = "info,breakwater_api::request_read=debug";

/// The `x-request-id`s of the requests an API process read, from its log (JSON lines; the
/// `breakwater_api::request_read` debug events).
fn read_request_ids(log: &Path) -> HashSet<String> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    text.lines()
        .filter(|l| l.contains("breakwater_api::request_read"))
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter_map(|v| v["fields"]["request_id"].as_str().map(str::to_owned))
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Slow and hostile clients.

fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// The API's own pid when it runs under `pinned` (the runner's child).
fn find_api_pid(runner: u32) -> Option<u32> {
    for _ in 0..200 {
        if let Ok(children) = std::fs::read_to_string(format!("/proc/{runner}/task/{runner}/children"))
            && let Some(pid) = children.split_whitespace().next().and_then(|p| p.parse().ok())
        {
            return Some(pid);
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    None
}

fn can_pin() -> bool {
    let root = Command::new("id").arg("-u").output().is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0");
    root && Path::new("/sys/fs/cgroup").exists()
}

/// Keeps a connection open, sending a request's headers one byte every `gap`; returns how long
/// the server took to close it (or `None` if it was still open at `limit`).
async fn slowloris(port: u16, gap: Duration, limit: Duration) -> Option<Duration> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).await.ok()?;
    // The server's header timeout runs from a request's first byte: so does this clock.
    let started = Instant::now();
    let head = b"GET /health HTTP/1.1\r\nHost: chaos\r\nX-Slow: ";
    if s.write_all(head).await.is_err() {
        return Some(started.elapsed());
    }
    let mut buf = [0u8; 512];
    while started.elapsed() < limit {
        if s.write_all(b"a").await.is_err() {
            return Some(started.elapsed());
        }
        // A 408 or any other answer is the server ending it: keep going until it closes.
        if let Ok(Ok(0) | Err(_)) = tokio::time::timeout(gap, s.read(&mut buf)).await {
            return Some(started.elapsed());
        }
    }
    None
}

/// Sends one complete request, reads the answer, then stays idle; returns how long after the
/// answer the server closed the connection.
async fn idle_keep_alive(port: u16, limit: Duration) -> Option<Duration> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).await.ok()?;
    s.write_all(b"GET /health HTTP/1.1\r\nHost: chaos\r\n\r\n").await.ok()?;
    let mut buf = [0u8; 1024];
    let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf)).await.ok()?.ok()?;
    if n == 0 {
        return None;
    }
    let answered = Instant::now();
    match tokio::time::timeout(limit, async {
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await
    {
        Ok(()) => Some(answered.elapsed()),
        Err(_) => None,
    }
}

/// Sends `head` (and optionally part of a body) and returns the status line's code, or what
/// happened instead, within `within`.
async fn raw_status(port: u16, head: Vec<u8>, within: Duration) -> String {
    let attempt = async {
        // A handshake the kernel never completes (its accept queue is full, so it drops the SYN)
        // is a refusal: nothing was accepted.
        let mut s = match tokio::time::timeout(within, TcpStream::connect(("127.0.0.1", port))).await {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => return Err(format!("connect: {e}")),
            Err(_) => return Err("connect: not accepted (SYN unanswered)".to_owned()),
        };
        // The server may answer (and close) before the whole head is written: that is fine.
        let _ = s.write_all(&head).await;
        let mut buf = Vec::new();
        let mut chunk = [0u8; 4096];
        loop {
            match s.read(&mut chunk).await {
                Ok(0) => break,
                Ok(n) => {
                    buf.extend_from_slice(&chunk[..n]);
                    if buf.windows(4).any(|w| w == b"\r\n\r\n") {
                        break;
                    }
                }
                Err(e) if buf.is_empty() => return Err(format!("closed: {}", e.kind())),
                Err(_) => break,
            }
        }
        let text = String::from_utf8_lossy(&buf);
        Ok(text.split_whitespace().nth(1).map_or_else(|| "closed without an answer".to_owned(), str::to_owned))
    };
    // The connect has its own `within`; the answer gets `within` more.
    match tokio::time::timeout(within * 2, attempt).await {
        Ok(Ok(s) | Err(s)) => s,
        Err(_) => "no answer".to_owned(),
    }
}

async fn hostile(lab: &Lab, port: u16, accept_rate: u32, report: &mut Report) -> anyhow::Result<Api> {
    const S: &str = "hostile";
    let header_timeout = 3u64;
    let keep_alive = 6u64;
    let max_connections = 1024usize;
    let pinned = can_pin();
    let env = [
        ("HEADER_READ_TIMEOUT_SECS", header_timeout.to_string()),
        ("KEEP_ALIVE_TIMEOUT_SECS", keep_alive.to_string()),
        ("REQUEST_TIMEOUT_SECS", "5".to_owned()),
        ("MAX_CONNECTIONS", max_connections.to_string()),
        ("MAX_ACCEPT_RATE", accept_rate.to_string()),
    ];
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let mut api = lab.spawn_api(port, &env, pinned)?;
    if pinned {
        api.pid = find_api_pid(api.child.id()).context("the pinned API's pid")?;
        report.note(format!("the API runs under `cargo xtask pinned` (0.25 core, 512 MiB), pid {}", api.pid));
    } else {
        report.note("not root or no cgroup filesystem: the API runs unpinned (whole machine)".into());
    }
    wait_healthy(&api.base(), Duration::from_secs(30)).await?;
    let base = api.base();
    let ops = api.ops_base();
    // Warm up, then take the baseline memory.
    let warm = open_loop("warm-up", base.clone(), lab.tenants.clone(), 20.0, Duration::from_secs(2), Instant::now());
    warm.await?;
    let baseline = rss_kib(api.pid).unwrap_or(0);
    // The flood is sized on this process's own capacity (pinned, it is a fraction of the machine's).
    let capacity = lab.capacity(&base).await?;
    report.note(format!("capacity of this API process: {capacity:.0} req/s"));

    let duration = Duration::from_secs(if lab.quick { 15 } else { 30 });
    let t0 = Instant::now();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));

    // The /health probe, on its own keep-alive connection (as a load balancer's health check).
    let probe = {
        let base = base.clone();
        let ops = ops.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            let client = reqwest::Client::builder().timeout(Duration::from_secs(5)).build().ok()?;
            let mut lat = Vec::new();
            let mut errors = 0usize;
            let mut open_max = 0u64;
            let mut i = 0u32;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let started = Instant::now();
                match client.get(format!("{base}/health")).send().await {
                    Ok(r) if r.status().is_success() => lat.push(started.elapsed()),
                    _ => errors += 1,
                }
                // Every tenth probe, the server's own count of open connections (from the ops
                // listener, which the public cap does not count).
                i += 1;
                if i.is_multiple_of(10)
                    && let Ok(r) = client.get(format!("{ops}/v1/ops/status")).send().await
                    && let Ok(v) = r.json::<Value>().await
                {
                    open_max = open_max.max(v["layers"]["connections"]["open"].as_u64().unwrap_or(0));
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Some((lat, errors, open_max))
        })
    };
    let sampler = {
        let (pid, stop) = (api.pid, stop.clone());
        tokio::spawn(async move {
            let mut peak = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                peak = peak.max(rss_kib(pid).unwrap_or(0));
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            peak
        })
    };

    // Slowloris: headers trickled one byte every 500 ms, far slower than the header timeout.
    let slow_n = if lab.quick { 200 } else { 400 };
    let slow: Vec<_> = (0..slow_n)
        .map(|_| tokio::spawn(slowloris(port, Duration::from_millis(500), Duration::from_secs(header_timeout + 10))))
        .collect();
    // Idle keep-alive connections past the timeout.
    let idle_n = if lab.quick { 100 } else { 200 };
    let idle: Vec<_> =
        (0..idle_n).map(|_| tokio::spawn(idle_keep_alive(port, Duration::from_secs(keep_alive + 10)))).collect();

    // Oversized headers and bodies.
    let token = lab.tenants[0].token.clone();
    let mut oversized = Vec::new();
    let big_header = format!("GET /health HTTP/1.1\r\nHost: chaos\r\nX-Big: {}\r\n\r\n", "a".repeat(1 << 20));
    oversized.push(("1 MiB header", raw_status(port, big_header.into_bytes(), Duration::from_secs(5)).await));
    let many_headers: String = (0..2000).map(|i| format!("X-H{i}: v\r\n")).collect();
    let many = format!("GET /health HTTP/1.1\r\nHost: chaos\r\n{many_headers}\r\n");
    oversized.push(("2000 headers", raw_status(port, many.into_bytes(), Duration::from_secs(5)).await));
    let declared = format!(
        "POST /v1/contacts HTTP/1.1\r\nHost: chaos\r\nAuthorization: Bearer {token}\r\n\
         Content-Type: application/json\r\nContent-Length: 104857600\r\n\r\n{{\"name\":\""
    );
    oversized.push(("100 MiB declared body", raw_status(port, declared.into_bytes(), Duration::from_secs(5)).await));
    let mut chunked = format!(
        "POST /v1/contacts HTTP/1.1\r\nHost: chaos\r\nAuthorization: Bearer {token}\r\n\
         Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    .into_bytes();
    for _ in 0..64 {
        chunked.extend_from_slice(format!("{:x}\r\n{}\r\n", 16 * 1024, "a".repeat(16 * 1024)).as_bytes());
    }
    oversized.push(("1 MiB chunked body", raw_status(port, chunked, Duration::from_secs(5)).await));

    // A flood of new connections: 50x the measured capacity in connection attempts per second,
    // each sending one request, bounded at 2000 in flight on our side.
    let flood_rate = (capacity * 50.0).clamp(500.0, 20_000.0);
    let flood_for = Duration::from_secs(if lab.quick { 5 } else { 10 });
    let gate = Arc::new(tokio::sync::Semaphore::new(2000));
    let mut flood = Vec::new();
    let interval = Duration::from_secs_f64(1.0 / flood_rate);
    let mut next = Instant::now();
    let flood_end = next + flood_for;
    let mut skipped = 0usize;
    while next < flood_end {
        tokio::time::sleep_until(next.into()).await;
        next += interval;
        let Ok(permit) = gate.clone().try_acquire_owned() else {
            skipped += 1;
            continue;
        };
        flood.push(tokio::spawn(async move {
            let got = raw_status(
                port,
                b"GET /health HTTP/1.1\r\nHost: chaos\r\nConnection: close\r\n\r\n".to_vec(),
                Duration::from_secs(10),
            )
            .await;
            drop(permit);
            got
        }));
    }

    let mut flood_counts: BTreeMap<String, usize> = BTreeMap::new();
    for f in flood {
        *flood_counts.entry(f.await?).or_default() += 1;
    }
    let mut slow_closed = Vec::new();
    let mut slow_open = 0usize;
    for s in slow {
        match s.await? {
            Some(d) => slow_closed.push(d),
            None => slow_open += 1,
        }
    }
    let mut idle_closed = Vec::new();
    let mut idle_open = 0usize;
    for s in idle {
        match s.await? {
            Some(d) => idle_closed.push(d),
            None => idle_open += 1,
        }
    }
    let remaining = duration.saturating_sub(t0.elapsed());
    tokio::time::sleep(remaining).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (lat, probe_errors, open_max) = probe.await?.context("probe")?;
    if let Ok(r) = client()?.get(format!("{ops}/v1/ops/status")).send().await
        && let Ok(v) = r.json::<Value>().await
    {
        let c = &v["layers"]["connections"];
        report.note(format!(
            "the edge's own counts: MAX_ACCEPT_RATE {accept_rate} ({}), accept loop paused {} times; {} refused \
             with the canned 503, {} reset, {} health probes served over the cap",
            if c["accept_rate"].is_null() {
                "no limit".to_owned()
            } else {
                format!("burst {}", c["accept_rate"]["burst"])
            },
            c["accept_paced"],
            c["refused"],
            c["reset"],
            c["served_over_cap"]
        ));
    }
    let peak = sampler.await?;

    // Nothing left queued: once the attack is over, open connections drain to the probe's own.
    let client = reqwest::Client::builder().timeout(Duration::from_secs(2)).build()?;
    let mut open_after = None;
    let drain_deadline = Instant::now() + Duration::from_secs(keep_alive + 5);
    while Instant::now() < drain_deadline {
        if let Ok(r) = client.get(format!("{ops}/v1/ops/status")).send().await
            && let Ok(v) = r.json::<Value>().await
        {
            open_after = v["layers"]["connections"]["open"].as_u64();
            if open_after.is_some_and(|n| n <= 2) {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let after = rss_kib(api.pid).unwrap_or(0);

    let p99 = percentile(lat.clone(), 99);
    let p50 = percentile(lat.clone(), 50);
    report.check(
        S,
        "/health stays responsive through every attack",
        "p99 <= 250 ms, no failed probe",
        format!(
            "{} probes: p50 {}, p99 {}, max {}, {probe_errors} failed",
            lat.len(),
            ms(p50),
            ms(p99),
            ms(percentile(lat, 100))
        ),
        p99 <= Duration::from_millis(250) && probe_errors == 0,
    );
    let slow_max = slow_closed.iter().max().copied().unwrap_or_default();
    report.check(
        S,
        &format!("slowloris: {slow_n} connections trickling headers"),
        &format!("all closed by the server within the {header_timeout} s header timeout + 2 s"),
        format!("{} closed (max {}), {slow_open} still open", slow_closed.len(), ms(slow_max)),
        slow_open == 0 && slow_max <= Duration::from_secs(header_timeout + 2),
    );
    let idle_max = idle_closed.iter().max().copied().unwrap_or_default();
    report.check(
        S,
        &format!("idle keep-alive: {idle_n} connections"),
        &format!("all closed within the {keep_alive} s idle timeout + 2 s"),
        format!("{} closed (max {}), {idle_open} still open", idle_closed.len(), ms(idle_max)),
        idle_open == 0 && idle_max <= Duration::from_secs(keep_alive + 2),
    );
    let oversized_ok =
        oversized.iter().all(|(_, got)| matches!(got.as_str(), "413" | "431" | "400") || got.starts_with("closed"));
    report.check(
        S,
        "oversized headers and bodies",
        "413/431/400 or the connection closed, within 5 s; never served",
        oversized.iter().map(|(w, g)| format!("{w}: {g}")).collect::<Vec<_>>().join("; "),
        oversized_ok,
    );
    let served = flood_counts.get("200").copied().unwrap_or(0);
    let waiting = flood_counts.get("no answer").copied().unwrap_or(0);
    // Served, shed (503), or refused: a refused or unanswered handshake, or a connection closed
    // without an answer. A connection the kernel completed but nobody answered within 10 s is
    // the failure this check exists for (it waits in the accept queue, or in the server).
    let bad: usize = flood_counts
        .iter()
        .filter(|(k, _)| {
            !(k.as_str() == "200" || k.as_str() == "503" || k.starts_with("connect") || k.starts_with("closed"))
        })
        .map(|(_, n)| *n)
        .sum();
    report.check(
        S,
        &format!("connection flood at {flood_rate:.0} new connections/s (50x capacity) for {} s", flood_for.as_secs()),
        "each served, shed (503) or refused; none connected and unanswered past 10 s",
        format!(
            "{flood_counts:?}; {skipped} not attempted (2000 in flight already); server's open connections peaked at \
             {open_max} of {max_connections}; {waiting} waited past 10 s"
        ),
        bad == 0 && served > 0 && u64::try_from(max_connections).is_ok_and(|m| open_max <= m),
    );
    report.check(
        S,
        "memory bounded",
        "peak RSS <= baseline + 256 MiB, and below 512 MiB",
        format!("baseline {} MiB, peak {} MiB, after {} MiB", baseline / 1024, peak / 1024, after / 1024),
        peak <= baseline + 256 * 1024 && peak < 512 * 1024,
    );
    report.check(
        S,
        "nothing queued without bound",
        "open connections back to the probe's own within the idle timeout",
        format!("{open_after:?} open"),
        open_after.is_some_and(|n| n <= 2),
    );
    Ok(api)
}

// ---------------------------------------------------------------------------------------------
// Fuzzing with schemathesis.

fn venv() -> PathBuf {
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(|| services::root().join("target"));
    cache.join("breakwater").join("chaos-venv")
}

/// The schemathesis release the suite was written against (its CLI changed at 4.0).
const SCHEMATHESIS: &str = "schemathesis>=4.3,<5";

fn ensure_schemathesis() -> anyhow::Result<PathBuf> {
    let venv = venv();
    let st = venv.join("bin").join("st");
    if !st.exists() {
        eprintln!("installing {SCHEMATHESIS} into a virtualenv in the user's cache");
        let ok = Command::new("python3").arg("-m").arg("venv").arg(&venv).status()?.success();
        anyhow::ensure!(ok, "python3 -m venv failed (install python3-venv)");
        let ok = Command::new(venv.join("bin").join("pip")).args(["install", "-q", SCHEMATHESIS]).status()?.success();
        anyhow::ensure!(ok, "pip install {SCHEMATHESIS} failed");
    }
    Ok(st)
}

async fn fuzz(lab: &Lab, api: &Api, report: &mut Report) -> anyhow::Result<()> {
    const S: &str = "fuzz";
    let st = ensure_schemathesis()?;
    let budget = if lab.quick { 45 } else { 240 };
    for (name, tenant) in ["A", "B"].iter().zip(&lab.tenants) {
        let started = Instant::now();
        let out = tokio::process::Command::new(&st)
            .args(["run", &format!("{}/openapi.json", api.base())])
            .args([
                "--checks",
                "not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance",
            ])
            // One worker: with two, its threads parse lambdas' source at once, and CPython 3.11's
            // AST constructor is not thread-safe ("AST constructor recursion depth mismatch", a
            // tool error CI met with every request passing).
            .args(["--max-time", &budget.to_string(), "--workers", "1", "--request-timeout", "10"])
            .args(["--phases", "examples,coverage,fuzzing", "--no-color"])
            .args(["-H", &format!("Authorization: Bearer {}", tenant.token)])
            .env("SCHEMATHESIS_HOOKS", "")
            // It keeps a cache (.schemathesis/) in its working directory: the lab's, not the repository.
            .current_dir(&lab.dir)
            .kill_on_drop(true)
            .output();
        let out = tokio::time::timeout(Duration::from_secs(budget + 120), out).await.context("schemathesis hung")??;
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        let log = lab.dir.join(format!("schemathesis-{name}.log"));
        std::fs::write(&log, &text)?;
        // The generated-cases line and the closing line ("N failures ... in 45.02s").
        let lines: Vec<&str> = text.lines().map(str::trim).collect();
        let mut summary: Vec<&str> = lines
            .windows(2)
            .filter(|w| w[0] == "Test cases:")
            .map(|w| w[1])
            .chain(lines.iter().copied().filter(|l| l.starts_with('=') && l.contains(" in ")))
            .collect();
        summary.dedup();
        let summary: Vec<String> = summary.iter().map(|l| l.trim_matches(['=', ' ']).to_owned()).collect();
        // The failures, if any, in full; the rest is in the log file.
        if !out.status.success() {
            println!("{text}");
        }
        report.check(
            S,
            &format!("schemathesis, tenant {name}'s token, all operations"),
            "exit 0: no 5xx, no schema or status violations",
            format!("{} after {} s: {}", out.status, started.elapsed().as_secs(), summary.join(" / ")),
            out.status.success(),
        );
    }
    // The API's log is searched for panics when it stops, after this scenario.
    Ok(())
}
