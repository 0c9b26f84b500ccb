//! Per-tenant totals over the run: each step's counts are added in as it finishes, and read
//! back as the tenants' results, heaviest first, with Jain's fairness index.

use std::collections::BTreeMap;

use super::Engine;
use crate::stats::{StepRecorder, TenantCounts};

impl Engine {
    /// Adds a finished step's per-tenant counts to the run's totals.
    pub(super) fn add_tenant_counts(&self, rec: &StepRecorder) {
        if let Ok(mut t) = self.tenants.lock() {
            for (i, c) in rec.tenant_counts() {
                let e = t.entry(i).or_insert_with(|| TenantCounts {
                    sent: 0,
                    ok: 0,
                    refused: 0,
                    refused_by_code: BTreeMap::new(),
                    errors: 0,
                    ok_latency: crate::stats::Hist::coarse(),
                });
                e.sent += c.sent;
                e.ok += c.ok;
                e.refused += c.refused;
                for (code, n) in c.refused_by_code {
                    *e.refused_by_code.entry(code).or_default() += n;
                }
                e.errors += c.errors;
                e.ok_latency.add(&c.ok_latency);
            }
        }
    }

    /// Per-tenant results over every step so far, heaviest first, and Jain's index.
    pub fn tenant_reports(&self) -> (Vec<crate::report::TenantReport>, Option<f64>) {
        let Ok(t) = self.tenants.lock() else {
            return (Vec::new(), None);
        };
        let total: u64 = t.values().map(|c| c.sent).sum();
        let mut out: Vec<_> = t
            .iter()
            .filter_map(|(i, c)| {
                let tenant = self.tokens.tenants().get(*i)?;
                Some(crate::report::TenantReport {
                    tenant_id: tenant.tenant_id.clone(),
                    weight: tenant.weight,
                    sent: c.sent,
                    share: c.sent as f64 / total.max(1) as f64,
                    ok: c.ok,
                    refused: c.refused,
                    refused_by_code: c.refused_by_code.clone(),
                    errors: c.errors,
                    refused_share: c.refused as f64 / c.sent.max(1) as f64,
                    ok_p99_ms: c.ok_latency.summary().p99_ms,
                })
            })
            .collect();
        out.sort_by_key(|t| std::cmp::Reverse(t.sent));
        let admitted: Vec<f64> = out.iter().map(|t| t.ok as f64 / t.sent.max(1) as f64).collect();
        let fairness = if out.len() > 1 { crate::report::jain(&admitted) } else { None };
        (out, fairness)
    }
}
