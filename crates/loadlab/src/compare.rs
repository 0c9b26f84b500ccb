//! The comparison gate: compares whole curves (capacity, knee, saturation, and p95/p99,
//! goodput and errors per matched step) and calls a regression only past noise-aware
//! thresholds: a p95 that doubles (and moved by more than a few milliseconds), a capacity
//! that drops by a third. A gate that fails on noise gets ignored.

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use crate::report::{Report, StepReport, ms};

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Thresholds {
    /// A step's p95 (or p99) regresses when it grows by this factor...
    pub latency_factor: f64,
    /// ...and by at least this many milliseconds.
    pub min_latency_rise_ms: f64,
    /// Capacity, saturation throughput, knee or a step's goodput regress when they drop by
    /// this fraction.
    pub throughput_drop: f64,
    /// A step's error share regresses when it rises by this much (absolute, 0.01 = 1 point).
    pub error_rise: f64,
}

impl Default for Thresholds {
    fn default() -> Self {
        Self { latency_factor: 2.0, min_latency_rise_ms: 5.0, throughput_drop: 1.0 / 3.0, error_rise: 0.01 }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    Ok,
    Regression,
    Improved,
    /// Not comparable (a step missing or invalid on one side).
    Skipped,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Check {
    pub what: String,
    pub baseline: Option<f64>,
    pub current: Option<f64>,
    pub verdict: Verdict,
    pub note: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Comparison {
    pub checks: Vec<Check>,
    pub regressions: usize,
}

impl Comparison {
    pub fn passed(&self) -> bool {
        self.regressions == 0
    }

    pub fn table(&self) -> String {
        let mut o = String::new();
        for c in &self.checks {
            let v = |x: Option<f64>| x.map_or("-".into(), |x| format!("{x:.2}"));
            let mark = match c.verdict {
                Verdict::Ok => "ok",
                Verdict::Regression => "REGRESSION",
                Verdict::Improved => "improved",
                Verdict::Skipped => "skipped",
            };
            let _ = writeln!(o, "{:<34} {:>10} -> {:<10} {:<10} {}", c.what, v(c.baseline), v(c.current), mark, c.note);
        }
        let _ = writeln!(
            o,
            "{}",
            if self.passed() {
                "PASS: no regression beyond the thresholds".to_owned()
            } else {
                format!("FAIL: {} regression(s)", self.regressions)
            }
        );
        o
    }
}

/// Higher is better (throughputs): regression when it drops by more than `drop`.
fn higher_better(what: String, base: Option<f64>, cur: Option<f64>, drop: f64) -> Check {
    match (base, cur) {
        (Some(b), Some(c)) if b > 0.0 => {
            let ratio = c / b;
            let verdict = if ratio < 1.0 - drop {
                Verdict::Regression
            } else if ratio > 1.0 + drop {
                Verdict::Improved
            } else {
                Verdict::Ok
            };
            Check {
                what,
                baseline: base,
                current: cur,
                verdict,
                note: format!("x{ratio:.2} (fails below x{:.2})", 1.0 - drop),
            }
        }
        (Some(_), None) => {
            Check { what, baseline: base, current: cur, verdict: Verdict::Regression, note: "lost".into() }
        }
        _ => Check { what, baseline: base, current: cur, verdict: Verdict::Skipped, note: "not in baseline".into() },
    }
}

/// Lower is better (latencies): regression when it grows by the factor and the floor.
fn lower_better(what: String, b: f64, c: f64, t: &Thresholds) -> Check {
    let verdict = if c > b * t.latency_factor && c - b > t.min_latency_rise_ms {
        Verdict::Regression
    } else if b > c * t.latency_factor && b - c > t.min_latency_rise_ms {
        Verdict::Improved
    } else {
        Verdict::Ok
    };
    Check {
        what,
        baseline: Some(b),
        current: Some(c),
        verdict,
        note: format!("{} -> {} (fails above x{} and +{})", ms(b), ms(c), t.latency_factor, ms(t.min_latency_rise_ms)),
    }
}

fn matching<'a>(s: &StepReport, cur: &'a Report) -> Option<&'a StepReport> {
    cur.steps.iter().find(|c| c.label == s.label).or_else(|| {
        cur.steps.iter().find(|c| match (s.offered_rps, c.offered_rps, s.concurrency, c.concurrency) {
            (Some(a), Some(b), _, _) => (a - b).abs() <= 0.01 * a.max(b),
            (_, _, Some(a), Some(b)) => a == b,
            _ => false,
        })
    })
}

/// Compares `cur` against `base`.
pub fn compare(base: &Report, cur: &Report, t: &Thresholds) -> Comparison {
    let mut checks = Vec::new();
    let (ba, ca) = (base.analysis.as_ref(), cur.analysis.as_ref());
    if ba.is_some() || ca.is_some() {
        let cap = |a: Option<&crate::analysis::Analysis>| a.and_then(|a| a.capacity.as_ref()).map(|c| c.capacity_rps);
        checks.push(higher_better("capacity (req/s)".into(), cap(ba), cap(ca), t.throughput_drop));
        let sat =
            |a: Option<&crate::analysis::Analysis>| a.and_then(|a| a.saturation.as_ref()).map(|s| s.throughput_rps);
        checks.push(higher_better("saturation throughput (req/s)".into(), sat(ba), sat(ca), t.throughput_drop));
        let knee = |a: Option<&crate::analysis::Analysis>| a.and_then(|a| a.knee.as_ref()).map(|k| k.offered_rps);
        if knee(ba).is_some() {
            checks.push(higher_better("knee (offered req/s)".into(), knee(ba), knee(ca), t.throughput_drop));
        }
    }
    for s in &base.steps {
        let Some(c) = matching(s, cur) else {
            checks.push(Check {
                what: format!("step {}", s.label),
                baseline: None,
                current: None,
                verdict: Verdict::Skipped,
                note: "no matching step in the current run".into(),
            });
            continue;
        };
        if !s.audit.valid || !c.audit.valid {
            checks.push(Check {
                what: format!("step {}", s.label),
                baseline: None,
                current: None,
                verdict: Verdict::Skipped,
                note: "generator-limited on one side (see audit)".into(),
            });
            continue;
        }
        if s.ok.count > 0 && c.ok.count > 0 {
            checks.push(lower_better(format!("{} p95 (ms)", s.label), s.ok.corrected.p95_ms, c.ok.corrected.p95_ms, t));
            checks.push(lower_better(format!("{} p99 (ms)", s.label), s.ok.corrected.p99_ms, c.ok.corrected.p99_ms, t));
        }
        checks.push(higher_better(
            format!("{} goodput (req/s)", s.label),
            Some(s.goodput_rps),
            Some(c.goodput_rps),
            t.throughput_drop,
        ));
        let rise = c.error_share - s.error_share;
        checks.push(Check {
            what: format!("{} errors (share)", s.label),
            baseline: Some(s.error_share),
            current: Some(c.error_share),
            verdict: if rise > t.error_rise { Verdict::Regression } else { Verdict::Ok },
            note: format!("{:+.2} points (fails above +{:.2})", rise * 100.0, t.error_rise * 100.0),
        });
    }
    let regressions = checks.iter().filter(|c| c.verdict == Verdict::Regression).count();
    Comparison { checks, regressions }
}
