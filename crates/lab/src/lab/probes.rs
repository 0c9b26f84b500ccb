//! What the lab reads from the machine itself (`/proc`), beside what the load lab reports: the
//! machine's description, PostgreSQL's CPU and the machine's busy time, `/health`, and the
//! sampler that records them with the cgroup's counters through a run.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sqlx::postgres::PgPoolOptions;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use crate::record::{Machine, XSample};
use crate::rig::pinned::{Counters, Pinned};
use crate::rig::services;

impl Machine {
    pub(crate) fn read(unpinned: Option<String>) -> Self {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu_model = cpuinfo
            .lines()
            .find_map(|l| {
                l.strip_prefix("model name").and_then(|r| r.split_once(':')).map(|(_, m)| m.trim().to_owned())
            })
            .unwrap_or_else(|| "unknown".into());
        let mounts =
            crate::rig::pinned::parse_mounts(&std::fs::read_to_string("/proc/self/mounts").unwrap_or_default());
        let cgroup = if mounts.cpu.is_some() && mounts.memory.is_some() {
            "v1"
        } else if mounts.unified.is_some() {
            "v2"
        } else {
            "none"
        };
        Self {
            cores: std::thread::available_parallelism().map_or(1, std::num::NonZero::get),
            cpu_model,
            kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim().to_owned(),
            cgroup: cgroup.into(),
            unpinned,
            load_average: (load_average(), String::new()),
        }
    }
}

/// The 1, 5 and 15 minute load averages.
pub(crate) fn load_average() -> String {
    let text = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    text.split_whitespace().take(3).collect::<Vec<_>>().join(" ")
}

/// CPU seconds of every process named `postgres` (the server and its backends), by pid, from `/proc`.
pub(crate) fn postgres_cpu_seconds() -> Option<BTreeMap<u32, f64>> {
    let mut out = BTreeMap::new();
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
        let Ok(comm) = std::fs::read_to_string(entry.path().join("comm")) else { continue };
        if comm.trim() != "postgres" {
            continue;
        }
        if let Some(s) = breakwater_loadlab::procstat::cpu_seconds(Some(pid)) {
            out.insert(pid, s);
        }
    }
    (!out.is_empty()).then_some(out)
}

/// The machine's (busy, total) jiffies from the first line of `/proc/stat`.
pub(crate) fn machine_jiffies() -> Option<(u64, u64)> {
    parse_proc_stat(&std::fs::read_to_string("/proc/stat").ok()?)
}

pub(super) fn parse_proc_stat(text: &str) -> Option<(u64, u64)> {
    let line = text.lines().next()?.strip_prefix("cpu ")?;
    let v: Vec<u64> = line.split_whitespace().filter_map(|x| x.parse().ok()).collect();
    // user nice system idle iowait irq softirq steal (guest time is inside user already)
    let total: u64 = v.iter().take(8).sum();
    let idle = v.get(3).copied().unwrap_or(0) + v.get(4).copied().unwrap_or(0);
    Some((total.saturating_sub(idle), total))
}

/// `GET /health` on a fresh connection: its latency in ms when it answered 200 in time.
pub(crate) async fn health(port: u16, timeout: Duration) -> Option<f64> {
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

/// Samples what the load lab cannot see from outside: the cgroup's counters, PostgreSQL's and
/// the machine's CPU, the lab database's active backends and `/health`.
pub(super) struct Sampler {
    t0: Instant,
    samples: Arc<Mutex<Vec<XSample>>>,
    stop: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Sampler {
    /// Samples every `every` until stopped: the API on `port`, the database of `db_url` on `server`.
    pub(super) async fn start(port: u16, server: &str, db_url: &str, pinned: Option<&Pinned>, every: Duration) -> Self {
        let t0 = Instant::now();
        let samples = Arc::new(Mutex::new(Vec::new()));
        let (stop, mut stopped) = tokio::sync::watch::channel(false);
        let cgroup = pinned.map(Pinned::counters);
        let database = services::database_name(db_url);
        let pool =
            PgPoolOptions::new().max_connections(1).connect(&services::with_database(server, "postgres")).await.ok();
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
                    cgroup: cgroup.as_ref().map(Counters::read),
                    postgres_cpu_s: postgres_cpu_seconds(),
                    machine: machine_jiffies(),
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

    pub(super) fn now(&self) -> f64 {
        self.t0.elapsed().as_secs_f64()
    }

    pub(super) async fn stop(self) -> Vec<XSample> {
        let _ = self.stop.send(true);
        let _ = self.task.await;
        self.samples.lock().map(|v| v.clone()).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_stat_busy_excludes_idle_and_iowait() {
        let text = "cpu  100 0 50 800 50 0 0 0 0 0\ncpu0 1 2 3\n";
        assert_eq!(parse_proc_stat(text), Some((150, 1000)));
        assert_eq!(parse_proc_stat("intr 1 2"), None);
    }
}
