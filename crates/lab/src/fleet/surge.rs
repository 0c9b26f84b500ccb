//! The surge, one admission variant at a time: the balancer, the worker and the first tasks
//! started, the load (a population that ignores Retry-After and one that honours it) through the
//! steady phase, the surge and the way back, and every second sampled while the autoscaler's
//! decisions start, drain and stop tasks.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use super::autoscaler::{Autoscaler, Event, TaskState};
use super::haproxy::Slot;
use super::processes::{self, Balancer, Launch, Proc};
use super::record::{self, TaskSecond};
use super::{Ctx, costs, log};
use crate::rig::services;

impl Ctx<'_> {
    /// One variant's fleet through the load.
    pub(super) async fn surge(&self) -> Result<record::Run> {
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

    /// The load lab driving one of the two populations through the balancer: `honour`, the share
    /// that honours Retry-After, or the rest; its report goes to `out`.
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
