//! The load's shape of a fleet run: its phases and rates, the tasks it starts with and may grow
//! to, and the autoscaler's periods, from the flags, the stack and one task's capacity (given, or
//! calibrated by the last full lab); and the load lab profile that drives it.

use std::path::Path;

use anyhow::{Context, Result};

use super::{FleetArgs, stack};

/// The load's shape.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub(crate) struct Plan {
    pub(crate) quick: bool,
    pub(crate) capacity_one: f64,
    pub(crate) capacity_how: String,
    /// Multiples of two tasks' capacity.
    pub(crate) steady_x: f64,
    pub(crate) surge_x: f64,
    pub(crate) steady_s: u64,
    pub(crate) surge_s: u64,
    pub(crate) after_s: u64,
    /// Share of the load from clients that honour Retry-After.
    pub(crate) honour_share: f64,
    pub(crate) tasks: u32,
    pub(crate) max_tasks: u32,
    pub(crate) period_s: u64,
    pub(crate) out_periods: u32,
    pub(crate) start_delay_s: u64,
    pub(crate) health_interval_s: u64,
}

impl Plan {
    pub(super) fn profiles(&self) -> String {
        format!(
            "# Written by `cargo xtask fleet`.\n\n[defaults]\nreader_share = 0.3\nthink_time = \"200ms\"\n\
             pause = \"0s\"\narrivals = \"poisson\"\n\n[profiles.fleet-surge]\n\
             description = \"Steady at {sx}x two tasks' capacity, a surge to {ux}x, then back.\"\nstages = [\n  \
             {{ name = \"steady\", duration = \"{a}s\", capacity = {sx} }},\n  \
             {{ name = \"surge\", duration = \"{b}s\", capacity = {ux} }},\n  \
             {{ name = \"after\", duration = \"{c}s\", capacity = {sx} }},\n]\n",
            sx = self.steady_x,
            ux = self.surge_x,
            a = self.steady_s,
            b = self.surge_s,
            c = self.after_s,
        )
    }

    /// The load's shape from the flags and the stack.
    pub(super) fn new(args: &FleetArgs, stack: &stack::Stack, root: &Path) -> Result<Self> {
        let capacity = match (args.capacity, args.quick) {
            (Some(c), _) => (c, "given with --capacity".to_owned()),
            (None, true) => (60.0, "a nominal 60 req/s: --quick measures nothing".to_owned()),
            (None, false) => lab_capacity(root)?,
        };
        let plan = Plan {
            quick: args.quick,
            capacity_one: capacity.0,
            capacity_how: capacity.1,
            steady_x: 0.8,
            surge_x: 2.5,
            steady_s: if args.quick { 20 } else { 120 },
            surge_s: if args.quick { 60 } else { 180 },
            after_s: if args.quick { 45 } else { 120 },
            honour_share: 0.2,
            tasks: args.tasks.unwrap_or(stack.scaling.min_tasks),
            max_tasks: args.max_tasks,
            period_s: if args.quick { 10 } else { 60 },
            out_periods: args.out_periods,
            start_delay_s: args.start_delay.unwrap_or(if args.quick { 10 } else { 60 }),
            health_interval_s: if args.quick { 2 } else { stack.balancer.health.interval.as_secs() },
        };
        anyhow::ensure!(plan.tasks >= 1 && plan.tasks <= plan.max_tasks, "--tasks must be between 1 and --max-tasks");
        Ok(plan)
    }
}

/// One task's capacity from the last full lab (docs/lab/lab.json).
fn lab_capacity(root: &Path) -> Result<(f64, String)> {
    let path = root.join("docs/lab/lab.json");
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).context("docs/lab/lab.json")?)?;
    let rps =
        v.pointer("/capacity/rps").and_then(serde_json::Value::as_f64).context("docs/lab/lab.json has no capacity")?;
    let commit = v.get("commit").and_then(serde_json::Value::as_str).unwrap_or("?");
    Ok((rps, format!("one pinned task's capacity calibrated by the full lab at {commit} (docs/lab/lab.json)")))
}
