//! Three tasks' capacity against one task's, in the same run: the lab's calibration (absolute
//! rates of the lab's mix, each step judged by the lab's own objective: admitted p99 <= 200 ms,
//! <= 1% refused, <= 0.1% errors, a valid step) through the balancer, first to one task and then
//! to three, with the rates three times as high. Opt-in (`--experiments capacity`): the ratio is
//! bounded by this machine as much as by the fleet (two cores carry the tasks, PostgreSQL, the
//! balancer and the generator), so each step also records, sampled beside it, the machine's CPU,
//! the tasks' (their cgroups summed) and PostgreSQL's, and what saturated, by the lab's rules.

use std::fmt::Write as _;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use super::processes::Proc;
use super::{Ctx, log};
use crate::lab::probes::{health, machine_jiffies, postgres_cpu_seconds};
use crate::record::reading::saturated;
use crate::record::{Capacity, PhaseRun, Row, XSample};
use crate::rig::pinned::Stats;

/// One task's rates; `n` tasks get `n` times each.
const RATES_ONE: [f64; 9] = [200.0, 300.0, 400.0, 500.0, 600.0, 700.0, 800.0, 900.0, 1000.0];
const STEP_S: u64 = 6;

/// One ramp: how many tasks, and what the calibration found.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Ramp {
    pub(crate) tasks: u32,
    pub(crate) capacity: Capacity,
}

/// The experiment's record.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct Record {
    /// When and at which commit (a run without the surge adds to the saved record).
    #[serde(default)]
    pub(crate) measured: String,
    pub(crate) ramps: Vec<Ramp>,
}

impl Record {
    /// The last ramp's capacity over the first's (three tasks over one).
    pub(crate) fn ratio(&self) -> Option<f64> {
        let (first, last) = (self.ramps.first()?, self.ramps.last()?);
        (self.ramps.len() > 1 && first.capacity.rps > 0.0).then(|| last.capacity.rps / first.capacity.rps)
    }

    /// The report's paragraph and table.
    pub(crate) fn markdown(&self) -> String {
        let mut m = String::new();
        let _ = writeln!(
            m,
            "**Three tasks against one** (`--experiments capacity`{}): the lab's calibration through the \
             balancer, {STEP_S} s steps of the lab's mix; a step meets the objective with admitted p99 <= 200 ms, <= 1% \
             refused and <= 0.1% errors. Capacity: the highest rate that met it.\n",
            if self.measured.is_empty() { String::new() } else { format!(", measured {}", self.measured) }
        );
        let _ =
            writeln!(m, "| tasks | capacity | steps: offered req/s -> 2xx/s, admitted p99, refused |\n|---|---|---|");
        for r in &self.ramps {
            let steps: Vec<String> = r
                .capacity
                .calibration
                .iter()
                .map(|row| {
                    format!(
                        "{:.0} -> {:.0}, {:.0} ms, {:.1}%{}{}",
                        row.offered_rps.unwrap_or(0.0),
                        row.ok_rps,
                        row.ok_p99_ms,
                        row.refused_share * 100.0,
                        cpu_note(row),
                        if row.valid { "" } else { " (invalid)" }
                    )
                })
                .collect();
            let _ = writeln!(m, "| {} | {:.0} req/s | {} |", r.tasks, r.capacity.rps, steps.join("; "));
        }
        if let Some(ratio) = self.ratio() {
            let _ = writeln!(m, "\nThree tasks' capacity / one task's: **{ratio:.2}** (goal >= 2.7).");
        }
        for r in &self.ramps {
            if let Some(past) = r.capacity.calibration.iter().find(|row| row.offered_rps > Some(r.capacity.rps))
                && past.machine_busy.is_some()
            {
                let what = if past.saturated.is_empty() {
                    "nothing the lab reads".to_owned()
                } else {
                    past.saturated.join("; ")
                };
                let _ = writeln!(
                    m,
                    "\n{} task(s), first step past the capacity ({:.0} req/s): saturated: {what}.",
                    r.tasks,
                    past.offered_rps.unwrap_or(0.0)
                );
            }
        }
        m
    }
}

/// A step's CPU, where it was sampled (records before it was are rendered as they were).
fn cpu_note(row: &Row) -> String {
    let Some(machine) = row.machine_busy else { return String::new() };
    let mut note = format!("; machine {:.0}% busy", machine * 100.0);
    if let Some(c) = row.api_cpu_cores {
        let _ = write!(note, ", tasks {c:.2} cores");
    }
    if let Some(t) = row.throttled_share {
        let _ = write!(note, " (throttled in {:.0}% of periods)", t * 100.0);
    }
    if let Some(p) = row.postgres_cpu_cores {
        let _ = write!(note, ", PostgreSQL {p:.2} cores");
    }
    note
}

impl Ctx<'_> {
    /// The calibration through the balancer to one task, then to `most` tasks.
    pub(super) async fn capacities(&self, most: u32) -> Result<Record> {
        let mut record = Record::default();
        for tasks in [1, most] {
            record.ramps.push(self.capacity(tasks).await.with_context(|| format!("the capacity of {tasks} tasks"))?);
        }
        Ok(record)
    }

    async fn capacity(&self, tasks: u32) -> Result<Ramp> {
        log(&format!("== capacity: {tasks} task(s) ==",));
        let name = format!("capacity-{tasks}");
        let redis_url = self.redis_url.clone();
        let launch = self.launch_as(&name, "adaptive", &redis_url, None);
        let (balancer, procs) = self.serving(&name, tasks, &launch).await?;
        let out = self.runs.join(format!("{name}.json"));
        let (ran, samples) = sampled(self.capacity_load(&name, tasks, &out), &procs, self.port).await;
        for p in procs {
            p.stop(std::time::Duration::from_secs(15)).await;
        }
        balancer.stop().await;
        ran?;
        let report = breakwater_loadlab::report::Report::read_json(&out)?;
        // The samples' clock starts as the generator is spawned, the report's as its run begins,
        // after the generator's start-up: each step's window is read that much early.
        let step_ends = report.steps.iter().map(|s| s.started_s + s.elapsed_s).collect();
        let run = PhaseRun {
            name: out.display().to_string(),
            report,
            flooder: None,
            step_ends,
            samples,
            cgroup_peak: None,
            cgroup_oom_kills: None,
            burn: None,
            db_cap: None,
        };
        let mut capacity = Capacity::from_calibration(&run, self.plan.quick)?;
        let quota = f64::from(tasks) * self.cpus.cores();
        for row in &mut capacity.calibration {
            row.saturated = saturated(row, quota);
        }
        log(&format!("capacity of {tasks} task(s): {:.0} req/s", capacity.rps));
        Ok(Ramp { tasks, capacity })
    }
}

impl Ctx<'_> {
    /// The ramp against the balancer, its report in `out`.
    async fn capacity_load(&self, name: &str, tasks: u32, out: &std::path::Path) -> Result<()> {
        let profiles = self.runs.join(format!("{name}-profiles.toml"));
        std::fs::write(&profiles, ramp_profile(tasks))?;
        let status = tokio::process::Command::new(self.bin.join("loadlab"))
            .args(["profile", "fleet-capacity", "--base", &format!("http://{}", self.listen())])
            .arg("--profiles")
            .arg(&profiles)
            .arg("--tokens")
            .arg(self.tokens)
            .args(["--max-in-flight", "4096", "--timeout", "30s", "--seed", "3", "--no-smoke"])
            .arg("--out")
            .arg(out)
            .stdin(Stdio::null())
            .stderr(std::fs::File::create(out.with_extension("log"))?)
            .kill_on_drop(true)
            .status()
            .await?;
        anyhow::ensure!(status.success(), "loadlab failed: see {}", out.with_extension("log").display());
        Ok(())
    }
}

/// Runs `load`, sampling beside it every half second what a step's row reads: the tasks' cgroups
/// summed (their CPU and throttling), PostgreSQL's CPU and the machine's, and `/health` through
/// the balancer on `port`.
async fn sampled(load: impl Future<Output = Result<()>>, procs: &[Proc], port: u16) -> (Result<()>, Vec<XSample>) {
    let t0 = Instant::now();
    let mut samples = Vec::new();
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    tokio::pin!(load);
    loop {
        tokio::select! {
            ran = &mut load => return (ran, samples),
            _ = tick.tick() => {
                let t_s = t0.elapsed().as_secs_f64();
                let (cgroup, postgres_cpu_s, machine) =
                    (procs.iter().filter_map(Proc::stats).reduce(Stats::together), postgres_cpu_seconds(), machine_jiffies());
                let health_ms = health(port, Duration::from_secs(1)).await;
                samples.push(XSample { t_s, cgroup, postgres_cpu_s, machine, pg_active: None, health_ms });
            }
        }
    }
}

/// The loadlab profile: one task's rates times `tasks`.
fn ramp_profile(tasks: u32) -> String {
    let mut t = String::from(
        "# Written by `cargo xtask fleet --experiments capacity`.\n\n[defaults]\nreader_share = 0.3\n\
         think_time = \"200ms\"\npause = \"0s\"\narrivals = \"poisson\"\n\n[profiles.fleet-capacity]\n\
         description = \"The lab's calibration, scaled to the tasks.\"\nstages = [\n",
    );
    for r in RATES_ONE {
        let rps = r * f64::from(tasks);
        let _ = writeln!(t, "  {{ name = \"cal-{rps:.0}\", duration = \"{STEP_S}s\", rps = {rps} }},");
    }
    t.push_str("]\n");
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ramp_scales_with_the_tasks_and_loadlab_reads_it() {
        let three = ramp_profile(3);
        assert!(three.contains("rps = 600") && three.contains("rps = 3000"), "{three}");
        let parsed = breakwater_loadlab::profiles::ProfilesFile::parse(&three).expect("a profiles file");
        let p = parsed.resolve("fleet-capacity", None, 1.0).expect("the profile resolves");
        assert_eq!(p.stages.len(), RATES_ONE.len());
    }

    #[test]
    fn the_ratio_is_the_last_ramp_over_the_first() {
        let ramp = |tasks, rps| Ramp { tasks, capacity: Capacity { rps, how: String::new(), calibration: Vec::new() } };
        let r = Record { measured: String::new(), ramps: vec![ramp(1, 600.0), ramp(3, 1_650.0)] };
        assert!((r.ratio().expect("two ramps") - 2.75).abs() < 1e-9);
        assert!(r.markdown().contains("**2.75**"));
        assert_eq!(Record { measured: String::new(), ramps: vec![ramp(1, 600.0)] }.ratio(), None);
    }

    #[test]
    fn a_sampled_step_says_what_saturated_and_an_unsampled_one_reads_as_before() {
        let step = |rps: f64, machine_busy: Option<f64>| Row {
            offered_rps: Some(rps),
            machine_busy,
            api_cpu_cores: machine_busy.map(|_| 0.62),
            postgres_cpu_cores: machine_busy.map(|_| 0.55),
            saturated: if machine_busy.is_some() { vec!["machine CPU (99% busy)".into()] } else { Vec::new() },
            ..Row::default()
        };
        let ramp =
            |calibration| Ramp { tasks: 3, capacity: Capacity { rps: 1_500.0, how: String::new(), calibration } };
        let sampled = Record {
            measured: String::new(),
            ramps: vec![ramp(vec![step(1_500.0, Some(0.9)), step(1_800.0, Some(0.99))])],
        };
        let m = sampled.markdown();
        assert!(m.contains("machine 99% busy, tasks 0.62 cores, PostgreSQL 0.55 cores"), "{m}");
        assert!(m.contains("first step past the capacity (1800 req/s): saturated: machine CPU (99% busy)."), "{m}");
        let before =
            Record { measured: String::new(), ramps: vec![ramp(vec![step(1_500.0, None), step(1_800.0, None)])] };
        let m = before.markdown();
        assert!(!m.contains("machine") && !m.contains("saturated"), "{m}");
    }
}
