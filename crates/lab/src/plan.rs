//! What `cargo xtask lab` runs: the runs and variants, their step sizes and durations, for the
//! full lab, `--quick`, and experiments (`--only`, `--variants`, `--capacity`). The plan is
//! recorded in the lab's JSON, so the report (`report`) reads it from there.

use serde::{Deserialize, Serialize};

use crate::rig::pinned::Millicores;

/// Every run, in order: the refusal cost once, then each variant's.
pub(crate) const PHASES: [&str; 10] = [
    "refusals",
    "sweep",
    "sweep-honouring",
    "sweep-one",
    "ramp",
    "ramp-one",
    "ramp-honouring",
    "change",
    "noisy",
    "flood",
];

fn every_phase() -> Vec<String> {
    PHASES.iter().map(|p| (*p).to_owned()).collect()
}

/// The variants of the full lab, in order.
pub(crate) const VARIANTS: [&str; 3] = ["off", "static", "adaptive"];

fn every_variant() -> Vec<String> {
    VARIANTS.iter().map(|v| (*v).to_owned()).collect()
}

pub(crate) fn quarter_core() -> f64 {
    Millicores::QUARTER.cores()
}

fn honour_multiples() -> Vec<f64> {
    vec![2.0, 10.0]
}

fn flood_callers() -> usize {
    64
}

fn flood_share() -> f64 {
    0.25
}

fn flood_step_s() -> f64 {
    30.0
}

fn refusal_callers() -> usize {
    16
}

fn refusal_step_s() -> f64 {
    10.0
}

/// Step lengths and points of a run; `quick` is the CI smoke shape.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Plan {
    pub(crate) quick: bool,
    /// The API's CPU quota, in cores (0.25 but in experiments).
    #[serde(default = "quarter_core")]
    pub(crate) api_cpus: f64,
    /// The runs made of each variant (all four but in experiments).
    #[serde(default = "every_phase")]
    pub(crate) phases: Vec<String>,
    /// The variants run (the three of the full lab but in experiments).
    #[serde(default = "every_variant")]
    pub(crate) variants: Vec<String>,
    /// The capacity given with `--capacity` instead of calibrated (experiments only).
    #[serde(default)]
    pub(crate) given_capacity: Option<f64>,
    /// More of the API's settings over the production tier's, `NAME=value` (experiments only).
    #[serde(default)]
    pub(crate) api_env: Vec<String>,
    pub(crate) sweep_callers: Vec<usize>,
    pub(crate) sweep_step_s: f64,
    pub(crate) calibration_rps: Vec<f64>,
    pub(crate) calibration_step_s: f64,
    pub(crate) ramp_multiples: Vec<f64>,
    pub(crate) ramp_step_s: f64,
    pub(crate) pause_s: f64,
    /// The capacity-change run: before, slowed, after (seconds) at `change_load` x capacity.
    pub(crate) change_phases_s: [f64; 3],
    pub(crate) change_load: f64,
    /// The noisy-neighbour run: the others at `noisy_base` x capacity, one tenant at 10x its share.
    pub(crate) noisy_base: f64,
    pub(crate) noisy_factor: f64,
    pub(crate) noisy_step_s: f64,
    /// The honouring ramp: clients that wait out `Retry-After`, at these multiples of capacity.
    #[serde(default = "honour_multiples")]
    pub(crate) honour_multiples: Vec<f64>,
    /// The flood: one tenant's closed loop of this many callers over its throttle...
    #[serde(default = "flood_callers")]
    pub(crate) flood_callers: usize,
    /// ...which admits this share of the capacity (rate and burst), while the other tenants
    /// offer their normal share of `noisy_base` x capacity.
    #[serde(default = "flood_share")]
    pub(crate) flood_share: f64,
    #[serde(default = "flood_step_s")]
    pub(crate) flood_step_s: f64,
    /// The refusal cost: closed-loop callers against a server that refuses everything.
    #[serde(default = "refusal_callers")]
    pub(crate) refusal_callers: usize,
    #[serde(default = "refusal_step_s")]
    pub(crate) refusal_step_s: f64,
    pub(crate) timeout_s: f64,
    pub(crate) max_in_flight: usize,
    pub(crate) sample_interval_ms: u64,
}

impl Plan {
    pub(crate) fn new(quick: bool) -> Self {
        let full = Self {
            quick,
            api_cpus: quarter_core(),
            phases: every_phase(),
            variants: every_variant(),
            given_capacity: None,
            api_env: Vec::new(),
            sweep_callers: vec![4, 16, 32, 192, 1000],
            sweep_step_s: 10.0,
            calibration_rps: vec![50.0, 100.0, 200.0, 300.0, 400.0, 550.0, 700.0, 900.0, 1200.0, 1600.0, 2000.0],
            calibration_step_s: 5.0,
            ramp_multiples: vec![0.25, 0.5, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0],
            ramp_step_s: 12.0,
            pause_s: 3.0,
            change_phases_s: [20.0, 40.0, 30.0],
            change_load: 0.8,
            noisy_base: 0.5,
            noisy_factor: 10.0,
            noisy_step_s: 30.0,
            honour_multiples: honour_multiples(),
            flood_callers: flood_callers(),
            flood_share: flood_share(),
            flood_step_s: flood_step_s(),
            refusal_callers: refusal_callers(),
            refusal_step_s: refusal_step_s(),
            timeout_s: 5.0,
            max_in_flight: 2048,
            sample_interval_ms: 1000,
        };
        if !quick {
            return full;
        }
        Self {
            sweep_callers: vec![4, 32, 192],
            sweep_step_s: 2.0,
            calibration_rps: vec![25.0, 50.0, 100.0, 200.0],
            calibration_step_s: 2.0,
            ramp_multiples: vec![0.5, 1.0, 2.0, 10.0],
            ramp_step_s: 2.0,
            pause_s: 1.0,
            change_phases_s: [3.0, 5.0, 3.0],
            noisy_step_s: 3.0,
            flood_callers: 16,
            flood_step_s: 3.0,
            refusal_step_s: 2.0,
            sample_interval_ms: 500,
            ..full
        }
    }

    /// Whether this is an experiment rather than the lab at the production shape: another CPU
    /// quota for the API, only some of the runs or variants, a capacity given, not measured, or
    /// more of the API's settings.
    pub(crate) fn is_experiment(&self) -> bool {
        (self.api_cpus - quarter_core()).abs() > 1e-9
            || self.given_capacity.is_some()
            || !self.api_env.is_empty()
            || self.phases != every_phase()
            || self.variants != every_variant()
    }

    /// Whether this plan makes `phase` (one of [`PHASES`]).
    pub(crate) fn runs(&self, phase: &str) -> bool {
        self.phases.iter().any(|p| p == phase)
    }

    /// The profiles file the load lab runs (calibration, ramp, capacity change, noisy neighbour).
    pub(crate) fn profiles(&self, noisy_rps: f64, others_rps: f64) -> String {
        let secs = |s: f64| format!("{}ms", (s * 1000.0).round());
        let mut t = format!(
            "# Written by `cargo xtask lab`: the stages of one lab run.\n\n[defaults]\nreader_share = 0.3\n\
             think_time = \"200ms\"\npause = \"{}\"\narrivals = \"poisson\"\n",
            secs(self.pause_s)
        );
        t.push_str(
            "\n[profiles.lab-calibrate]\ndescription = \"Absolute rates, to measure the capacity once.\"\nstages = [\n",
        );
        for r in &self.calibration_rps {
            t.push_str(&format!(
                "  {{ name = \"cal-{r:.0}\", duration = \"{}\", rps = {r} }},\n",
                secs(self.calibration_step_s)
            ));
        }
        t.push_str("]\n\n[profiles.lab-ramp]\ndescription = \"0.25x to 10x the measured capacity.\"\nstages = [\n");
        for m in &self.ramp_multiples {
            t.push_str(&format!(
                "  {{ name = \"{}\", duration = \"{}\", capacity = {m} }},\n",
                multiple_label(*m),
                secs(self.ramp_step_s)
            ));
        }
        let [a, b, c] = self.change_phases_s;
        let load = self.change_load;
        t.push_str(&format!(
            "]\n\n[profiles.lab-capacity-change]\ndescription = \"A steady load while PostgreSQL slows down and recovers.\"\n\
             pause = \"0s\"\nstages = [\n  {{ name = \"before\", duration = \"{}\", capacity = {load} }},\n  \
             {{ name = \"db-slowed\", duration = \"{}\", capacity = {load} }},\n  \
             {{ name = \"after\", duration = \"{}\", capacity = {load} }},\n]\n",
            secs(a),
            secs(b),
            secs(c)
        ));
        t.push_str(&format!(
            "\n[profiles.lab-noisy]\ndescription = \"One tenant at {}x its share, the others normal.\"\nstages = [\n  \
             {{ name = \"noisy\", duration = \"{}\", rps = {noisy_rps:.1} }},\n]\n",
            self.noisy_factor,
            secs(self.noisy_step_s)
        ));
        t.push_str(
            "\n[profiles.lab-ramp-honouring]\ndescription = \"Clients that wait out Retry-After, past capacity.\"\nstages = [\n",
        );
        for m in &self.honour_multiples {
            t.push_str(&format!(
                "  {{ name = \"{}\", duration = \"{}\", capacity = {m} }},\n",
                multiple_label(*m),
                secs(self.ramp_step_s)
            ));
        }
        t.push_str(&format!(
            "]\n\n[profiles.lab-flood-others]\ndescription = \"The tenants beside a flooding one, at their normal rate.\"\n\
             stages = [\n  {{ name = \"others\", duration = \"{}\", rps = {others_rps:.1} }},\n]\n",
            secs(self.flood_step_s)
        ));
        t
    }
}

/// `0.25x`, `2x`, `10x`.
pub(crate) fn multiple_label(m: f64) -> String {
    format!("{}x", format!("{m:.2}").trim_end_matches('0').trim_end_matches('.'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn variants_and_runs_other_than_the_full_labs_make_an_experiment() {
        let mut plan = Plan::new(false);
        assert!(!plan.is_experiment());
        plan.variants = vec!["adaptive".into()];
        assert!(plan.is_experiment());
        let mut plan = Plan::new(false);
        plan.phases = vec!["sweep".into()];
        assert!(plan.is_experiment());
        let mut plan = Plan::new(false);
        plan.api_env = vec!["MAX_ACCEPT_RATE=0".into()];
        assert!(plan.is_experiment());
        let profiles = Plan::new(true).profiles(100.0, 40.0);
        for p in
            ["lab-calibrate", "lab-ramp", "lab-capacity-change", "lab-noisy", "lab-ramp-honouring", "lab-flood-others"]
        {
            assert!(profiles.contains(&format!("[profiles.{p}]")), "{p} missing from\n{profiles}");
        }
        assert!(profiles.contains("rps = 40.0"), "the others beside the flood: {profiles}");
    }

    #[test]
    fn multiples_read_as_written() {
        assert_eq!(multiple_label(0.25), "0.25x");
        assert_eq!(multiple_label(2.0), "2x");
        assert_eq!(multiple_label(1.5), "1.5x");
        assert_eq!(multiple_label(10.0), "10x");
    }
}
