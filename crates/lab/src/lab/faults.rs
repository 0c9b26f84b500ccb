//! The capacity-change run's fault: PostgreSQL slowed down mid-run, by a CPU quota on the API
//! database's backends (with cgroups) or by competing CPU-heavy queries (without).

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::bail;
use sqlx::postgres::PgPoolOptions;

use super::progress::log;
use crate::record::{BurnRecord, DbCapRecord};
use crate::rig::pinned::{Adopted, Limits, Millicores, Pinned};
use crate::rig::services;

/// A competing load on PostgreSQL: connections each running CPU-heavy queries back to back.
#[derive(Debug, Clone, Copy)]
pub(super) struct Burn {
    pub(super) connections: usize,
}

impl Burn {
    pub(super) fn new(connections: usize) -> Self {
        Self { connections: connections.max(1) }
    }
}

pub(super) struct Burning {
    stop: Arc<std::sync::atomic::AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<(u64, Duration)>>,
}

pub(super) struct BurnDone {
    queries: u64,
    mean_ms: Option<f64>,
}

/// One heavy query: a streamed (not materialised) series, hashed and summed: CPU only.
pub(super) const BURN_SQL: &str = "SELECT sum(hashint8(g)) FROM (SELECT generate_series(1::bigint, 4000000) AS g) s";

impl Burning {
    pub(super) async fn start(server: &str, connections: usize) -> anyhow::Result<Self> {
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

    pub(super) async fn stop(self) -> BurnDone {
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
pub(super) enum Slowdown {
    /// The API database's backends under a CPU quota of this many cores.
    Cap(Millicores),
    /// Competing CPU-heavy queries (without cgroups).
    Burn(Burn),
}

/// A slowdown in force.
pub(super) enum Slowing {
    Capped(DbCap),
    Burning(Burn, Burning),
}

/// What a slowdown did, for the report.
pub(super) struct Slowed {
    pub(super) burn: Option<BurnRecord>,
    pub(super) cap: Option<DbCapRecord>,
}

impl Slowing {
    /// Slows down `server`'s PostgreSQL, or the backends serving `db_url`'s database.
    pub(super) async fn start(server: &str, db_url: &str, how: Slowdown) -> anyhow::Result<Self> {
        Ok(match how {
            Slowdown::Cap(cpus) => {
                let cap = DbCap::start(server, db_url, cpus).await?;
                log(&format!(
                    "slowing PostgreSQL down: the API database's {} backends under a quota of {cpus} cores \
                     (and those it opens meanwhile)",
                    lock(&cap.state).adopted.len()
                ));
                Self::Capped(cap)
            }
            Slowdown::Burn(b) => {
                log(&format!("slowing PostgreSQL down: {} connections of competing load", b.connections));
                Self::Burning(b, Burning::start(server, b.connections).await?)
            }
        })
    }

    pub(super) async fn stop(self) -> Slowed {
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
pub(super) struct DbCap {
    cpus: Millicores,
    started: Instant,
    state: Arc<Mutex<CapState>>,
    watcher: tokio::task::JoinHandle<()>,
}

pub(super) struct CapState {
    adopted: Vec<Adopted>,
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

pub(super) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The backends connected to `database`, except the asking one.
pub(super) async fn backends(admin: &sqlx::PgPool, database: &str) -> anyhow::Result<Vec<i32>> {
    Ok(sqlx::query_scalar("SELECT pid FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()")
        .bind(database)
        .fetch_all(admin)
        .await?)
}

impl DbCap {
    pub(super) async fn start(server: &str, db_url: &str, cpus: Millicores) -> anyhow::Result<Self> {
        let served = services::database_name(db_url);
        let admin =
            PgPoolOptions::new().max_connections(1).connect(&services::with_database(server, "postgres")).await?;
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

    pub(super) fn stop(self) -> DbCapRecord {
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
