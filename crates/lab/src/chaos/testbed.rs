//! The test bed every scenario shares: a private PostgreSQL cluster and a private Redis (on free
//! ports, in a temporary directory; the shared servers are never touched), the binaries, and the
//! tenants with their tokens; and the API processes started on it.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use uuid::Uuid;

use super::verdict::Report;
use crate::rig::services::{self, Cluster, RedisServer};

pub(super) const SECRET: &str = "chaos-suite-secret-chaos-suite-secret-0123456789";

/// The private servers, the binaries and the data every scenario shares.
pub(super) struct Testbed {
    pub(super) dir: PathBuf,
    pub(super) pg: Cluster,
    pub(super) redis_port: u16,
    pub(super) redis: Option<RedisServer>,
    pub(super) bin: PathBuf,
    pub(super) db_url: String,
    pub(super) prefix: String,
    pub(super) tenants: Vec<TenantData>,
    /// A tenant apart, whose agent attacks in the `hostile-tenant` scenario.
    pub(super) attacker: TenantData,
    pub(super) quick: bool,
}

/// A tenant's token and the conversations the load writes to.
#[derive(Debug, Clone)]
pub(super) struct TenantData {
    pub(super) tenant: Uuid,
    pub(super) user: Uuid,
    pub(super) token: String,
    pub(super) conversations: Vec<Uuid>,
}

/// A running API process.
pub(super) struct Api {
    pub(super) child: Child,
    pub(super) port: u16,
    /// The ops listener's port (`/ready`, `/metrics`, `/v1/ops/status`).
    pub(super) ops_port: u16,
    pub(super) log: PathBuf,
    /// The process whose memory is sampled (the API itself, also when it runs under `pinned`).
    pub(super) pid: u32,
}

impl Api {
    pub(super) fn base(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub(super) fn ops_base(&self) -> String {
        format!("http://127.0.0.1:{}", self.ops_port)
    }
}

impl Drop for Testbed {
    fn drop(&mut self) {
        self.redis = None;
        let _ = self.pg.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

pub(super) fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

impl Testbed {
    pub(super) async fn start(bin: PathBuf, quick: bool) -> anyhow::Result<Self> {
        let dir = std::env::temp_dir().join(format!("breakwater-chaos-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        let pg = Cluster::new(dir.join("pgdata"), free_port()?)?;
        pg.init()?;
        pg.start()?;
        let db_url = pg.url("breakwater");
        let redis_port = free_port()?;
        let mut bed = Self {
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
        bed.start_redis()?;
        services::create_database(&bed.db_url).await?;
        let pool = sqlx::postgres::PgPoolOptions::new().max_connections(2).connect(&bed.db_url).await?;
        breakwater_domain::migrate(&pool).await.context("migrating")?;
        for name in ["Chaos A", "Chaos B"] {
            bed.tenants.push(make_tenant(&pool, &bed.bin, name, "admin").await?);
        }
        bed.attacker = make_tenant(&pool, &bed.bin, "Chaos Attacker", "agent").await?;
        pool.close().await;
        Ok(bed)
    }

    pub(super) fn start_redis(&mut self) -> anyhow::Result<()> {
        self.redis = Some(RedisServer::start(self.redis_port, &self.dir.join("redis.log"))?);
        Ok(())
    }

    pub(super) fn kill_redis(&mut self) {
        self.redis = None;
    }

    /// Starts the API on `port`, logging JSON to a file; under `cargo xtask pinned` when asked.
    pub(super) fn spawn_api(&self, port: u16, env: &[(&str, &str)], pinned: bool) -> anyhow::Result<Api> {
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
}

/// A tenant with eight open conversations, and a token of its user with `role`.
pub(super) async fn make_tenant(pool: &sqlx::PgPool, bin: &Path, name: &str, role: &str) -> anyhow::Result<TenantData> {
    use breakwater_domain::contacts::{self, NewContact};
    use breakwater_domain::conversations::{self, NewConversation};
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
        let conv = conversations::create(pool, tenant, NewConversation::open(contact.id, inbox)).await?;
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

pub(super) async fn wait_healthy(base: &str, within: Duration) -> anyhow::Result<Duration> {
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

pub(super) fn terminate(child: &Child) -> anyhow::Result<()> {
    let pid = i32::try_from(child.id()).ok().and_then(rustix::process::Pid::from_raw).context("a child's pid")?;
    rustix::process::kill_process(pid, rustix::process::Signal::TERM)?;
    Ok(())
}

pub(super) fn stop_api(api: &mut Api) {
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

pub(super) fn report_panics(api: &Api, scenario: &'static str, report: &mut Report) {
    let log = std::fs::read_to_string(&api.log).unwrap_or_default();
    let panics = log.lines().filter(|l| l.contains("panicked")).count();
    let what = format!("panics in the API log (pid {}, port {})", api.pid, api.port);
    report.check(scenario, &what, "0", panics.to_string(), panics == 0);
}

/// The API's own pid when it runs under `pinned` (the runner's child).
pub(super) fn find_api_pid(runner: u32) -> Option<u32> {
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

pub(super) fn can_pin() -> bool {
    let root = Command::new("id").arg("-u").output().is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0");
    root && Path::new("/sys/fs/cgroup").exists()
}
