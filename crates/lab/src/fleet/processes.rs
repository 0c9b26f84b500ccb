//! The fleet's processes: HAProxy (driven over its runtime socket), the API tasks (each pinned
//! in a cgroup of its own at the production shape) and the worker.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::haproxy::Slot;
use crate::rig::pinned::{Counters, Limits, Millicores, Pinned, Stats};

/// HAProxy, in the foreground as a child, and its runtime API.
pub(crate) struct Balancer {
    child: tokio::process::Child,
    socket: PathBuf,
}

impl Balancer {
    pub(crate) async fn start(config: &Path, socket: &Path, log: &Path, listen: SocketAddr) -> Result<Self> {
        let log = std::fs::File::create(log)?;
        let child = tokio::process::Command::new("haproxy")
            .arg("-db")
            .arg("-f")
            .arg(config)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .context("starting haproxy")?;
        let mut b = Self { child, socket: socket.to_path_buf() };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if tokio::net::TcpStream::connect(listen).await.is_ok() && b.command("show info").await.is_ok() {
                return Ok(b);
            }
            if let Some(status) = b.child.try_wait()? {
                bail!("haproxy exited ({status}): see its log");
            }
            if Instant::now() > deadline {
                bail!("haproxy did not listen on {listen} within 10 s");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// One runtime API command; its answer.
    pub(crate) async fn command(&self, cmd: &str) -> Result<String> {
        let mut s = tokio::net::UnixStream::connect(&self.socket).await.context("haproxy's runtime socket")?;
        s.write_all(format!("{cmd}\n").as_bytes()).await?;
        let mut out = String::new();
        tokio::time::timeout(Duration::from_secs(2), s.read_to_string(&mut out))
            .await
            .context("haproxy's answer")??;
        Ok(out)
    }

    /// Registers a task: its slot takes traffic once its health checks pass. An ALB target
    /// starts `initial` and gets requests only after `HealthyThresholdCount` checks; HAProxy
    /// takes a server out of maintenance as up, so it leaves maintenance for drain (no new
    /// requests), has its health forced down, and only then is made ready.
    pub(crate) async fn register(&self, slot: &str) -> Result<()> {
        self.expect_empty(&format!("set server api/{slot} state drain")).await?;
        self.expect_empty(&format!("set server api/{slot} health down")).await?;
        self.expect_empty(&format!("set server api/{slot} state ready")).await
    }

    /// Deregisters a task: no new requests; what it has in flight finishes.
    pub(crate) async fn drain(&self, slot: &str) -> Result<()> {
        self.expect_empty(&format!("set server api/{slot} state drain")).await
    }

    /// Takes a stopped task's slot out altogether.
    pub(crate) async fn remove(&self, slot: &str) -> Result<()> {
        self.expect_empty(&format!("set server api/{slot} state maint")).await
    }

    async fn expect_empty(&self, cmd: &str) -> Result<()> {
        let out = self.command(cmd).await?;
        anyhow::ensure!(out.trim().is_empty(), "haproxy refused `{cmd}`: {}", out.trim());
        Ok(())
    }

    /// Each server's status as the balancer sees it (`UP`, `DOWN`, `MAINT`, `DRAIN`, `UP 1/2`...).
    pub(crate) async fn states(&self) -> Result<BTreeMap<String, String>> {
        let csv = self.command("show stat").await?;
        let mut lines = csv.lines();
        let header = lines.next().unwrap_or_default().trim_start_matches("# ");
        let col = |name: &str| header.split(',').position(|h| h == name);
        let (px, sv, st) = (col("pxname"), col("svname"), col("status"));
        let (Some(px), Some(sv), Some(st)) = (px, sv, st) else { bail!("unexpected `show stat` header: {header}") };
        let mut out = BTreeMap::new();
        for line in lines {
            let f: Vec<&str> = line.split(',').collect();
            if f.get(px) == Some(&"api") && !matches!(f.get(sv), Some(&"BACKEND" | &"FRONTEND")) {
                out.insert(f[sv].to_owned(), f.get(st).copied().unwrap_or("").to_owned());
            }
        }
        Ok(out)
    }

    /// Waits until every one of `slots` is `UP` (its health checks passed), for at most `within`.
    pub(crate) async fn wait_up(&self, slots: &[&str], within: Duration) -> Result<()> {
        let deadline = Instant::now() + within;
        loop {
            let states = self.states().await?;
            if slots.iter().all(|s| states.get(*s).is_some_and(|st| st.starts_with("UP"))) {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("tasks did not pass their health checks within {} s: {states:?}", within.as_secs());
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// Bytes into and out of the frontend so far.
    pub(crate) async fn frontend_bytes(&self) -> Option<(u64, u64)> {
        let csv = self.command("show stat").await.ok()?;
        let mut lines = csv.lines();
        let header: Vec<&str> = lines.next()?.trim_start_matches("# ").split(',').collect();
        let col = |name: &str| header.iter().position(|h| *h == name);
        let (sv, bin, bout) = (col("svname")?, col("bin")?, col("bout")?);
        let row: Vec<&str> =
            lines.map(|l| l.split(',').collect::<Vec<_>>()).find(|f| f.get(sv) == Some(&"FRONTEND"))?;
        Some((row.get(bin)?.parse().ok()?, row.get(bout)?.parse().ok()?))
    }

    pub(crate) async fn stop(mut self) {
        let _ = self.child.start_kill();
        let _ = self.child.wait().await;
    }
}

/// How a task or the worker is started.
pub(crate) struct Launch<'a> {
    pub(crate) bin: &'a Path,
    pub(crate) runs: &'a Path,
    pub(crate) db_url: &'a str,
    /// The run's name: its processes' logs are `<name>-<task>.log`.
    pub(crate) name: &'a str,
    /// `ADMISSION`: `adaptive`, `static` or `off`.
    pub(crate) admission: &'a str,
    /// The Redis every task shares.
    pub(crate) redis_url: &'a str,
    pub(crate) key_prefix: &'a str,
    /// The tenant limit every task holds (rate per second, burst), or `None` for limits out of
    /// reach.
    pub(crate) tenant_limit: Option<(f64, u32)>,
    pub(crate) pin: bool,
    pub(crate) cpus: Millicores,
}

/// A process in a cgroup of its own when pinning is possible.
pub(crate) struct Proc {
    pub(crate) child: tokio::process::Child,
    pub(crate) pid: u32,
    pinned: Option<Pinned>,
    counters: Option<Counters>,
    last: Option<(Instant, u64)>,
}

impl Proc {
    fn spawn(launch: &Launch<'_>, argv: &[std::ffi::OsString], log: &Path, env: &[(&str, String)]) -> Result<Self> {
        let pinned = if launch.pin {
            Some(Pinned::create(Limits::new(launch.cpus, 100_000, crate::lab::phase::MEMORY)?)?)
        } else {
            None
        };
        let mut cmd = match &pinned {
            Some(p) => p.command(argv)?,
            None => {
                let mut c = tokio::process::Command::new(&argv[0]);
                c.args(&argv[1..]).process_group(0);
                c
            }
        };
        let log = std::fs::File::create(log)?;
        cmd.env("DATABASE_URL", launch.db_url)
            .env("APP_ENV", "development")
            .env("LOG_FORMAT", "json")
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .kill_on_drop(true);
        let child = cmd.spawn().with_context(|| format!("starting {:?}", argv[0]))?;
        let pid = child.id().context("the process exited at once")?;
        let counters = pinned.as_ref().map(Pinned::counters);
        Ok(Self { child, pid, pinned, counters, last: None })
    }

    /// An API task on `slot`. As in the service stack: `THROTTLE_API_TASKS` is the most tasks
    /// that can run (the in-process fallback's share), and one proxy (the balancer) is trusted
    /// for `X-Forwarded-For`. Without a tenant limit, the throttles' limits are out of reach:
    /// the load generator is one address, and at 2.5x two tasks' capacity the heaviest tenant
    /// is far over its plan, which would measure the plan, not the fleet.
    pub(crate) fn api(launch: &Launch<'_>, slot: &Slot, max_tasks: u32) -> Result<Self> {
        let argv = [launch.bin.join("breakwater-api").into_os_string(), "serve".into()];
        let unreachable = "1000000".to_owned();
        let (tenant_rate, tenant_burst) = launch
            .tenant_limit
            .map_or_else(|| (unreachable.clone(), unreachable.clone()), |(r, b)| (r.to_string(), b.to_string()));
        let env = [
            ("BIND_ADDR", slot.api.to_string()),
            ("OPS_ADDR", slot.ops.to_string()),
            ("ADMISSION", launch.admission.to_owned()),
            ("REDIS_URL", launch.redis_url.to_owned()),
            ("THROTTLE_API_TASKS", max_tasks.to_string()),
            ("TRUSTED_PROXIES", "1".to_owned()),
            ("THROTTLE_KEY_PREFIX", launch.key_prefix.to_owned()),
            ("THROTTLE_TENANT_RATE", tenant_rate),
            ("THROTTLE_TENANT_BURST", tenant_burst),
            ("THROTTLE_USER_RATE", unreachable.clone()),
            ("THROTTLE_USER_BURST", unreachable.clone()),
            ("THROTTLE_IP_RATE", unreachable.clone()),
            ("THROTTLE_IP_BURST", unreachable),
            ("TOKIO_WORKER_THREADS", "1".to_owned()),
            ("SHUTDOWN_GRACE_SECS", "10".to_owned()),
        ];
        Self::spawn(launch, &argv, &launch.runs.join(format!("{}-{}.log", launch.name, slot.name)), &env)
    }

    /// The worker, as the service stack's one worker task.
    pub(crate) fn worker(launch: &Launch<'_>) -> Result<Self> {
        let argv = [launch.bin.join("breakwater-worker").into_os_string()];
        let env = [("REDIS_URL", launch.redis_url.to_owned())];
        Self::spawn(launch, &argv, &launch.runs.join(format!("{}-worker.log", launch.name)), &env)
    }

    /// Its cgroup's counters so far (`None` unpinned).
    pub(crate) fn stats(&self) -> Option<Stats> {
        self.counters.as_ref().map(Counters::read)
    }

    /// CPU used since the last call, as a share of one task's quota (`None` unpinned, or at the
    /// first call).
    pub(crate) fn cpu_share(&mut self, quota_cores: f64) -> Option<f64> {
        let used = self.counters.as_ref()?.read().usage_us?;
        let now = Instant::now();
        let share = self.last.map(|(t, u)| {
            let secs = now.saturating_duration_since(t).as_secs_f64().max(1e-3);
            (used.saturating_sub(u) as f64 / 1e6) / secs / quota_cores
        });
        self.last = Some((now, used));
        share
    }

    /// Peak memory of its cgroup.
    pub(crate) fn peak_bytes(&self) -> Option<u64> {
        self.pinned.as_ref().and_then(|p| p.stats().peak_bytes)
    }

    /// SIGTERM, `grace` to exit, then SIGKILL.
    pub(crate) async fn stop(mut self, grace: Duration) {
        if let Some(p) = i32::try_from(self.pid).ok().and_then(rustix::process::Pid::from_raw) {
            let _ = rustix::process::kill_process(p, rustix::process::Signal::TERM);
        }
        if tokio::time::timeout(grace, self.child.wait()).await.is_err() {
            let _ = self.child.kill().await;
        }
        drop(self.pinned.take());
    }
}

/// A task's admission figures from its `/v1/ops/status`: the limit summed over the route
/// classes (`None` with admission off) and the requests in flight.
pub(crate) async fn admission(http: &reqwest::Client, ops: SocketAddr) -> Option<(Option<f64>, f64)> {
    let v = ops_status(http, ops).await?;
    let capacity = v.pointer("/layers/capacity")?;
    let limit = capacity.get("limit").and_then(serde_json::Value::as_f64);
    Some((limit, capacity.get("in_flight")?.as_f64()?))
}

/// A task's `/v1/ops/status` (`None` when it does not answer).
pub(crate) async fn ops_status(http: &reqwest::Client, ops: SocketAddr) -> Option<serde_json::Value> {
    http.get(format!("http://{ops}/v1/ops/status")).send().await.ok()?.json().await.ok()
}
