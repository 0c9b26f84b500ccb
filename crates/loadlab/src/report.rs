//! The report: every step, every server sample and the reading of the curve, as JSON (the
//! source of truth), a terminal table, and (in `html`) a self-contained page.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::analysis::Analysis;
pub use crate::step::{Audit, LittlesLaw, Mode, SeriesSummary, StepReport, ms};

/// Bumped when a field changes meaning; `compare` refuses reports of another schema.
pub const SCHEMA: &str = "breakwater-loadlab/1";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunKind {
    Ramp,
    Sweep,
    Profile,
}

/// A whole run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Report {
    pub schema: String,
    pub kind: RunKind,
    /// `ramp`, `sweep`, or the profile's name.
    pub name: String,
    /// RFC 3339, UTC.
    pub started_at: String,
    pub target: String,
    /// The parameters the run was given, for reproducing it.
    pub config: serde_json::Value,
    pub generator: GeneratorInfo,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub smoke: Option<SmokeReport>,
    pub steps: Vec<StepReport>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub analysis: Option<Analysis>,
    /// Per-tenant results over the whole run, heaviest first.
    #[serde(default)]
    pub tenants: Vec<TenantReport>,
    /// Jain's fairness index over the tenants' admitted shares (ok / sent); 1 is perfectly fair.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fairness: Option<f64>,
    /// Server-side samples (`/v1/ops/status` flattened, `/proc` of the given pid).
    #[serde(default)]
    pub samples: Vec<ServerSample>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct GeneratorInfo {
    pub version: String,
    /// Cores the generator could use.
    pub cores: usize,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ServerSample {
    /// Seconds since the run started.
    pub t_s: f64,
    /// The step running when the sample was taken (none during pauses).
    pub step: Option<usize>,
    /// Dotted paths of every numeric field of `/v1/ops/status`, plus `proc.cpu_cores` and
    /// `proc.rss_bytes` when a pid was given.
    pub values: BTreeMap<String, f64>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TenantReport {
    pub tenant_id: String,
    pub weight: f64,
    pub sent: u64,
    /// This tenant's share of all requests sent.
    pub share: f64,
    pub ok: u64,
    pub refused: u64,
    /// Refusals per envelope `code` (absent in reports written before it was counted).
    #[serde(default)]
    pub refused_by_code: BTreeMap<String, u64>,
    pub errors: u64,
    pub refused_share: f64,
    pub ok_p99_ms: f64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SmokeReport {
    pub passed: bool,
    pub steps: Vec<SmokeStep>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SmokeStep {
    pub name: String,
    pub request: String,
    pub status: Option<u16>,
    pub latency_ms: f64,
    pub ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl Report {
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
    }

    pub fn write_json(&self, path: &Path) -> std::io::Result<()> {
        std::fs::write(path, self.to_json())
    }

    pub fn read_json(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| anyhow::anyhow!("cannot read {}: {e}", path.display()))?;
        let r: Self = serde_json::from_str(&text)
            .map_err(|e| anyhow::anyhow!("{} is not a loadlab report: {e}", path.display()))?;
        if r.schema != SCHEMA {
            anyhow::bail!("{} has schema {:?}, expected {SCHEMA:?}", path.display(), r.schema);
        }
        Ok(r)
    }

    /// The terminal table: one row per step, then the reading of the curve.
    pub fn table(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "{} {} against {}", self.kind_name(), self.name, self.target);
        let _ = writeln!(
            out,
            "{:<14} {:>9} {:>9} {:>9} {:>8} {:>8} {:>8} {:>8} {:>8} {:>7} {:>6} {:>8}  audit",
            "step",
            "offered",
            "achieved",
            "goodput",
            "p50",
            "p95",
            "p99",
            "max",
            "p99 unc",
            "refused",
            "errors",
            "lag p99"
        );
        for s in &self.steps {
            let offered = match (s.offered_rps, s.concurrency) {
                (Some(r), _) => format!("{r:.0}/s"),
                (None, Some(c)) => format!("c={c}"),
                _ => "-".into(),
            };
            let audit =
                if s.audit.valid { "ok".to_owned() } else { format!("INVALID: {}", s.audit.reasons.join("; ")) };
            let _ = writeln!(
                out,
                "{:<14} {:>9} {:>9.1} {:>9.1} {:>8} {:>8} {:>8} {:>8} {:>8} {:>6.1}% {:>6} {:>8}  {}",
                truncate(&s.label, 14),
                offered,
                s.achieved_rps,
                s.goodput_rps,
                ms(s.ok.corrected.p50_ms),
                ms(s.ok.corrected.p95_ms),
                ms(s.ok.corrected.p99_ms),
                ms(s.ok.corrected.max_ms),
                ms(s.ok.uncorrected.p99_ms),
                s.refused_share * 100.0,
                s.errors.stats.count,
                ms(s.send_lag.p99_ms),
                audit
            );
            if !s.refused.by_code.is_empty() {
                let codes: Vec<String> = s.refused.by_code.iter().map(|(k, v)| format!("{k}={v}")).collect();
                let _ = writeln!(
                    out,
                    "{:<14} refused: {} (Retry-After on {}), p50 {}",
                    "",
                    codes.join(" "),
                    s.refused.retry_after_seen,
                    ms(s.refused.stats.corrected.p50_ms)
                );
            }
            if !s.errors.by_kind.is_empty() {
                let kinds: Vec<String> = s.errors.by_kind.iter().map(|(k, v)| format!("{k}={v}")).collect();
                let _ = writeln!(out, "{:<14} errors: {}", "", kinds.join(" "));
            }
            if let Some(l) = &s.logical {
                let _ = writeln!(
                    out,
                    "{:<14} honouring Retry-After: {} requests, {} succeeded, {} gave up, {} cut off by the step's end, {:.2} attempts per success, time to success p50 {} p99 {}",
                    "",
                    l.requests,
                    l.succeeded,
                    l.gave_up,
                    l.cut_off,
                    l.attempts_per_success,
                    ms(l.time_to_success.p50_ms),
                    ms(l.time_to_success.p99_ms)
                );
            }
            if let Some(h) = &s.audit.littles_law.hidden_queueing {
                let _ = writeln!(out, "{:<14} little's law: {h}", "");
            }
        }
        if let Some(a) = &self.analysis {
            out.push_str(&a.describe());
        }
        if !self.tenants.is_empty() {
            let _ = writeln!(out, "tenants (heaviest 5 of {}):", self.tenants.len());
            for t in self.tenants.iter().take(5) {
                let _ = writeln!(
                    out,
                    "  {}  share {:>5.1}%  refused {:>5.1}%  errors {:>5}  ok p99 {}",
                    t.tenant_id,
                    t.share * 100.0,
                    t.refused_share * 100.0,
                    t.errors,
                    ms(t.ok_p99_ms)
                );
            }
            if let Some(f) = self.fairness {
                let _ = writeln!(out, "  fairness (Jain, admitted share per tenant): {f:.3}");
            }
        }
        out
    }

    fn kind_name(&self) -> &'static str {
        match self.kind {
            RunKind::Ramp => "ramp",
            RunKind::Sweep => "sweep",
            RunKind::Profile => "profile",
        }
    }
}

fn truncate(s: &str, n: usize) -> String {
    if s.chars().count() <= n { s.to_owned() } else { s.chars().take(n).collect() }
}

/// Jain's fairness index: (sum x)^2 / (n sum x^2). 1 when every x is equal, 1/n at worst.
pub fn jain(xs: &[f64]) -> Option<f64> {
    let n = xs.len() as f64;
    let sum: f64 = xs.iter().sum();
    let sq: f64 = xs.iter().map(|x| x * x).sum();
    if xs.is_empty() || sq == 0.0 { None } else { Some(sum * sum / (n * sq)) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jain_index_bounds() {
        assert_eq!(jain(&[1.0, 1.0, 1.0]), Some(1.0));
        let worst = jain(&[1.0, 0.0, 0.0, 0.0]).unwrap_or_default();
        assert!((worst - 0.25).abs() < 1e-9);
        assert_eq!(jain(&[]), None);
    }
}
