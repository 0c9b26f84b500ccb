//! Reading the curve of one open-loop ramp: the knee (p99 rises first, then p50), the
//! saturation throughput (achieved stops tracking offered), and the capacity at an objective
//! (the highest offered rate meeting the p99 objective, times a headroom factor). Steps the
//! self-audit marked invalid are left out: their numbers describe the generator.

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use crate::step::{Mode, StepReport, ms};

/// The objective and the sensitivities of the reading.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AnalysisConfig {
    /// p99 objective for ok responses, milliseconds.
    pub slo_p99_ms: f64,
    /// Fraction of the highest rate meeting the objective to plan at (0.7 = 30% headroom).
    pub headroom: f64,
    /// A percentile has risen when it exceeds `knee_factor` x its best earlier value...
    pub knee_factor: f64,
    /// ...and that value plus this many milliseconds (so microsecond jitter is not a knee).
    pub knee_min_rise_ms: f64,
    /// Achieved tracks offered while goodput >= (1 - tolerance) x offered.
    pub tracking_tolerance: f64,
    /// A step meets the objective only with at most this share of errors...
    pub max_error_share: f64,
    /// ...and at most this share of refusals.
    pub max_refused_share: f64,
    /// The server's CPU quota in cores, if known (0.25 on the production task shape).
    #[serde(default)]
    pub server_cpus: Option<f64>,
}

impl Default for AnalysisConfig {
    fn default() -> Self {
        Self {
            slo_p99_ms: 200.0,
            headroom: 0.7,
            knee_factor: 1.5,
            knee_min_rise_ms: 5.0,
            tracking_tolerance: 0.05,
            max_error_share: 0.001,
            max_refused_share: 0.01,
            server_cpus: None,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Analysis {
    pub config: AnalysisConfig,
    #[serde(default)]
    pub knee: Option<Knee>,
    #[serde(default)]
    pub saturation: Option<Saturation>,
    #[serde(default)]
    pub capacity: Option<Capacity>,
    /// Evidence from the server samples (and the audit) of which resource ran out.
    #[serde(default)]
    pub what_saturated: Vec<String>,
    #[serde(default)]
    pub notes: Vec<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Knee {
    /// First step whose p99 rose.
    pub step: usize,
    pub offered_rps: f64,
    pub p99_ms: f64,
    /// The best p99 of the steps before it.
    pub baseline_p99_ms: f64,
    /// The last step before the rise, if any.
    #[serde(default)]
    pub last_flat_rps: Option<f64>,
    /// First step whose p50 rose (at or after the p99 knee, usually).
    #[serde(default)]
    pub p50_step: Option<usize>,
    #[serde(default)]
    pub p50_offered_rps: Option<f64>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Saturation {
    /// Peak goodput over the ramp: the saturation throughput.
    pub throughput_rps: f64,
    /// First step where goodput fell behind offered by more than the tolerance.
    pub step: usize,
    pub offered_rps: f64,
    pub goodput_rps: f64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Capacity {
    /// Highest offered rate meeting the objective.
    pub max_ok_rps: f64,
    pub step: usize,
    pub p99_ms: f64,
    /// `max_ok_rps` x headroom: the number to plan with.
    pub capacity_rps: f64,
}

fn usable(s: &StepReport) -> Option<f64> {
    (s.mode == Mode::Open && s.audit.valid && s.ok.count > 0).then_some(s.offered_rps?)
}

fn rose(value: f64, best: f64, cfg: &AnalysisConfig) -> bool {
    value > best * cfg.knee_factor && value > best + cfg.knee_min_rise_ms
}

/// Reads one ramp. Closed-loop steps have no offered rate and are ignored.
pub fn analyze(steps: &[StepReport], cfg: &AnalysisConfig) -> Analysis {
    let mut notes = Vec::new();
    let invalid: Vec<String> = steps.iter().filter(|s| !s.audit.valid).map(|s| s.label.clone()).collect();
    if !invalid.is_empty() {
        notes.push(format!("left out (generator-limited, see audit): {}", invalid.join(", ")));
    }
    let pts: Vec<(&StepReport, f64)> = steps.iter().filter_map(|s| usable(s).map(|r| (s, r))).collect();

    // The knee: the first step whose p99 rose above the best p99 before it.
    let mut knee = None;
    let mut best99 = f64::INFINITY;
    let mut best50 = f64::INFINITY;
    let mut prev_rate = None;
    for (s, rate) in &pts {
        let p99 = s.ok.corrected.p99_ms;
        let p50 = s.ok.corrected.p50_ms;
        if knee.is_none() && best99.is_finite() && rose(p99, best99, cfg) {
            knee = Some(Knee {
                step: s.index,
                offered_rps: *rate,
                p99_ms: p99,
                baseline_p99_ms: best99,
                last_flat_rps: prev_rate,
                p50_step: None,
                p50_offered_rps: None,
            });
        }
        if let Some(k) = knee.as_mut()
            && k.p50_step.is_none()
            && best50.is_finite()
            && rose(p50, best50, cfg)
        {
            k.p50_step = Some(s.index);
            k.p50_offered_rps = Some(*rate);
        }
        if knee.is_none() {
            best99 = best99.min(p99);
            prev_rate = Some(*rate);
        }
        if knee.as_ref().is_none_or(|k| k.p50_step.is_none()) {
            best50 = best50.min(p50);
        }
    }

    // Saturation: the peak goodput, found where achieved stops tracking offered.
    let peak = pts.iter().map(|(s, _)| s.goodput_rps).fold(0.0_f64, f64::max);
    let saturation =
        pts.iter().find(|(s, rate)| s.goodput_rps < (1.0 - cfg.tracking_tolerance) * rate).map(|(s, rate)| {
            Saturation { throughput_rps: peak, step: s.index, offered_rps: *rate, goodput_rps: s.goodput_rps }
        });
    if saturation.is_none() && !pts.is_empty() {
        notes.push(format!(
            "saturation not reached: goodput tracked offered up to the last step (peak {peak:.1}/s); ramp higher"
        ));
    }

    // Capacity: the highest offered rate meeting the objective, with headroom.
    let capacity = pts
        .iter()
        .filter(|(s, rate)| {
            s.ok.corrected.p99_ms <= cfg.slo_p99_ms
                && s.error_share <= cfg.max_error_share
                && s.refused_share <= cfg.max_refused_share
                && s.goodput_rps >= (1.0 - cfg.tracking_tolerance) * rate
        })
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .map(|(s, rate)| Capacity {
            max_ok_rps: *rate,
            step: s.index,
            p99_ms: s.ok.corrected.p99_ms,
            capacity_rps: rate * cfg.headroom,
        });
    if capacity.is_none() && !pts.is_empty() {
        notes.push(format!(
            "no step met p99 <= {} with errors <= {:.1}% and refusals <= {:.1}%",
            ms(cfg.slo_p99_ms),
            cfg.max_error_share * 100.0,
            cfg.max_refused_share * 100.0
        ));
    }

    let focus = saturation.as_ref().map(|s| s.step).or_else(|| knee.as_ref().map(|k| k.step));
    let what_saturated = focus.map(|i| evidence(steps, i, cfg)).unwrap_or_default();

    Analysis { config: cfg.clone(), knee, saturation, capacity, what_saturated, notes }
}

/// What the server's own figures say at the step where throughput stopped rising.
fn evidence(steps: &[StepReport], at: usize, cfg: &AnalysisConfig) -> Vec<String> {
    let mut out = Vec::new();
    let Some(step) = steps.iter().find(|s| s.index == at) else {
        return out;
    };
    let prev = steps.iter().rev().find(|s| s.index < at);
    if let Some(cpu) = step.server.get("proc.cpu_cores") {
        match cfg.server_cpus {
            Some(quota) if quota > 0.0 => {
                let pct = cpu.mean / quota * 100.0;
                let verdict = if pct >= 90.0 { "saturated" } else { "not the limit" };
                out.push(format!("server CPU {:.2} of {quota} cores ({pct:.0}%): {verdict}", cpu.mean));
            }
            _ => out.push(format!("server CPU {:.2} cores (mean), {:.2} (max)", cpu.mean, cpu.max)),
        }
    }
    for (key, v) in &step.server {
        let Some(prefix) = key.strip_suffix("in_flight") else {
            continue;
        };
        if let Some(limit) = step.server.get(&format!("{prefix}limit"))
            && limit.mean > 0.0
        {
            let full = v.mean / limit.mean;
            out.push(format!(
                "{key} {:.1} of {prefix}limit {:.1} ({:.0}% full){}",
                v.mean,
                limit.mean,
                full * 100.0,
                if full >= 0.9 { ": admission limit reached" } else { "" }
            ));
        }
    }
    for (key, v) in &step.server {
        let lower = key.to_ascii_lowercase();
        if lower.contains("queue_depth") && v.max > 0.0 {
            out.push(format!("{key} up to {:.0} (mean {:.1})", v.max, v.mean));
        }
        if lower.contains("shed") || lower.contains("rejected") || lower.contains("timeouts") {
            let before = prev.and_then(|p| p.server.get(key)).map_or(0.0, |p| p.last);
            if v.last > before {
                out.push(format!("{key} +{:.0} during the step", v.last - before));
            }
        }
        if lower.starts_with("pool.") && (lower.contains("wait") || lower.contains("pending")) && v.max > 0.0 {
            out.push(format!("{key} up to {:.1}: database pool contended", v.max));
        }
    }
    if !step.audit.valid {
        out.push(format!("the generator was the limit: {}", step.audit.reasons.join("; ")));
    }
    if out.is_empty() {
        out.push("no server samples for this step (pass --ops-url and/or --pid to find out)".into());
    }
    out
}

impl Analysis {
    /// The reading, with its evidence, for the terminal.
    pub fn describe(&self) -> String {
        let mut o = String::new();
        match &self.knee {
            Some(k) => {
                let _ = write!(
                    o,
                    "knee: p99 rose at {:.0}/s ({} vs best {} before",
                    k.offered_rps,
                    ms(k.p99_ms),
                    ms(k.baseline_p99_ms)
                );
                if let Some(f) = k.last_flat_rps {
                    let _ = write!(o, "; flat up to {f:.0}/s");
                }
                let _ = write!(o, ")");
                if let Some(r) = k.p50_offered_rps {
                    let _ = write!(o, "; p50 rose at {r:.0}/s");
                }
                o.push('\n');
            }
            None => o.push_str("knee: not found (p99 never rose)\n"),
        }
        match &self.saturation {
            Some(s) => {
                let _ = writeln!(
                    o,
                    "saturation: {:.1}/s peak goodput; achieved stopped tracking offered at {:.0}/s ({:.1}/s achieved)",
                    s.throughput_rps, s.offered_rps, s.goodput_rps
                );
            }
            None => o.push_str("saturation: not reached\n"),
        }
        match &self.capacity {
            Some(c) => {
                let _ = writeln!(
                    o,
                    "capacity: {:.0}/s = {:.0}/s (highest meeting p99 <= {}, p99 was {}) x headroom {}",
                    c.capacity_rps,
                    c.max_ok_rps,
                    ms(self.config.slo_p99_ms),
                    ms(c.p99_ms),
                    self.config.headroom
                );
            }
            None => {
                let _ = writeln!(o, "capacity: none (no step met p99 <= {})", ms(self.config.slo_p99_ms));
            }
        }
        for e in &self.what_saturated {
            let _ = writeln!(o, "  evidence: {e}");
        }
        for n in &self.notes {
            let _ = writeln!(o, "  note: {n}");
        }
        o
    }
}
