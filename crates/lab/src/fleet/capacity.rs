//! Three tasks' capacity against one task's, in the same run: the lab's calibration (absolute
//! rates of the lab's mix, each step judged by the lab's own objective: admitted p99 <= 200 ms,
//! <= 1% refused, <= 0.1% errors, a valid step) through the balancer, first to one task and then
//! to three, with the rates three times as high. Opt-in (`--experiments capacity`): the ratio is
//! bounded by this machine as much as by the fleet (two cores carry the tasks, PostgreSQL, the
//! balancer and the generator), which the report says.

use std::fmt::Write as _;
use std::process::Stdio;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use super::{Ctx, log};
use crate::record::{Capacity, PhaseRun};

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
                        "{:.0} -> {:.0}, {:.0} ms, {:.1}%{}",
                        row.offered_rps.unwrap_or(0.0),
                        row.ok_rps,
                        row.ok_p99_ms,
                        row.refused_share * 100.0,
                        if row.valid { "" } else { " (invalid)" }
                    )
                })
                .collect();
            let _ = writeln!(m, "| {} | {:.0} req/s | {} |", r.tasks, r.capacity.rps, steps.join("; "));
        }
        if let Some(ratio) = self.ratio() {
            let _ = writeln!(m, "\nThree tasks' capacity / one task's: **{ratio:.2}** (goal >= 2.7).");
        }
        m
    }
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
        let ran = self.capacity_load(&name, tasks, &out).await;
        for p in procs {
            p.stop(std::time::Duration::from_secs(15)).await;
        }
        balancer.stop().await;
        ran?;
        let report = breakwater_loadlab::report::Report::read_json(&out)?;
        let run = PhaseRun {
            name: out.display().to_string(),
            report,
            flooder: None,
            step_ends: Vec::new(),
            samples: Vec::new(),
            cgroup_peak: None,
            cgroup_oom_kills: None,
            burn: None,
            db_cap: None,
        };
        let capacity = Capacity::from_calibration(&run, self.plan.quick)?;
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
}
