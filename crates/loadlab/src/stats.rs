//! Histograms and per-step counters. Every latency figure comes from an HdrHistogram in
//! microseconds, so p99 and max are exact to three significant figures at any rate.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

use crate::classify::Outcome;

/// Highest latency a histogram holds (10 minutes); longer values are clamped, never dropped.
const MAX_US: u64 = 600_000_000;

/// A latency histogram in microseconds.
#[derive(Debug, Clone)]
pub struct Hist(Histogram<u64>);

impl Hist {
    /// Three significant figures: the precision of every headline figure.
    pub fn new() -> Self {
        Self::with_sigfig(3)
    }

    /// Two significant figures: enough for per-tenant and per-endpoint breakdowns, 8x smaller.
    pub fn coarse() -> Self {
        Self::with_sigfig(2)
    }

    fn with_sigfig(sigfig: u8) -> Self {
        match Histogram::new_with_bounds(1, MAX_US, sigfig) {
            Ok(h) => Self(h),
            // The bounds are constants that hdrhistogram accepts; this arm is unreachable.
            Err(e) => panic!("histogram bounds rejected: {e}"),
        }
    }

    pub fn record(&mut self, d: Duration) {
        let us = u64::try_from(d.as_micros()).unwrap_or(MAX_US).clamp(1, MAX_US);
        self.0.saturating_record(us);
    }

    pub fn len(&self) -> u64 {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn add(&mut self, other: &Hist) {
        // Same bounds on both sides, so adding cannot fail.
        let _ = self.0.add(&other.0);
    }

    /// Percentile summary in milliseconds.
    pub fn summary(&self) -> Pcts {
        if self.0.is_empty() {
            return Pcts::default();
        }
        let ms = |us: u64| us as f64 / 1000.0;
        Pcts {
            count: self.0.len(),
            mean_ms: self.0.mean() / 1000.0,
            p50_ms: ms(self.0.value_at_quantile(0.50)),
            p95_ms: ms(self.0.value_at_quantile(0.95)),
            p99_ms: ms(self.0.value_at_quantile(0.99)),
            max_ms: ms(self.0.max()),
        }
    }
}

impl Default for Hist {
    fn default() -> Self {
        Self::new()
    }
}

/// Percentiles of one latency distribution, in milliseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Pcts {
    pub count: u64,
    pub mean_ms: f64,
    pub p50_ms: f64,
    pub p95_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

/// One class of responses (ok, refused or error) with latencies both ways.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ClassStats {
    pub count: u64,
    /// From the intended send time (coordinated-omission corrected, as wrk2).
    pub corrected: Pcts,
    /// From the actual send time: what a closed-loop tool would report.
    pub uncorrected: Pcts,
}

#[derive(Debug, Clone, Default)]
struct ClassHists {
    corrected: Hist,
    uncorrected: Hist,
}

impl ClassHists {
    fn stats(&self) -> ClassStats {
        ClassStats {
            count: self.corrected.len(),
            corrected: self.corrected.summary(),
            uncorrected: self.uncorrected.summary(),
        }
    }
}

/// What one request was: its times and how it ended.
#[derive(Debug, Clone)]
pub struct Sample<'a> {
    /// When the schedule meant to send it.
    pub intended: Instant,
    /// When the generator actually started sending it.
    pub actual: Instant,
    /// When the whole response (or the failure) was in.
    pub end: Instant,
    pub outcome: &'a Outcome,
    /// Index into the run's tenant list, if the request carried a token.
    pub tenant: Option<usize>,
    /// A stable name for the endpoint or journey step.
    pub endpoint: &'static str,
}

#[derive(Debug, Clone, Default)]
struct TenantAcc {
    sent: u64,
    ok: u64,
    refused: u64,
    refused_by_code: BTreeMap<String, u64>,
    errors: u64,
    ok_latency: Hist,
}

#[derive(Debug, Clone, Default)]
struct EndpointAcc {
    ok: u64,
    refused: u64,
    errors: u64,
    latency: Hist,
}

/// Accumulates one step's requests. Cheap to update under a mutex: a few histogram records.
#[derive(Debug, Default)]
pub struct StepRecorder {
    ok: ClassHists,
    refused: ClassHists,
    errors: ClassHists,
    all: ClassHists,
    send_lag: Hist,
    refused_by_code: BTreeMap<String, u64>,
    retry_after_seen: u64,
    errors_by_kind: BTreeMap<String, u64>,
    tenants: BTreeMap<usize, TenantAcc>,
    endpoints: BTreeMap<&'static str, EndpointAcc>,
    last_end: Option<Instant>,
    /// Sum of (end - actual) in seconds: time-integral of in-flight requests.
    busy_s: f64,
    /// Sum of (end - intended) in seconds.
    corrected_s: f64,
    /// Second by second, when the run asks for it.
    timeline: Option<crate::timeline::Timeline>,
}

impl StepRecorder {
    pub fn new() -> Self {
        Self::default()
    }

    /// One that also keeps the step second by second from `origin`.
    pub fn with_timeline(origin: Instant) -> Self {
        Self { timeline: Some(crate::timeline::Timeline::new(origin)), ..Self::default() }
    }

    pub fn timeline(&self) -> Option<Vec<crate::timeline::Second>> {
        self.timeline.as_ref().map(crate::timeline::Timeline::seconds)
    }

    pub fn record(&mut self, s: &Sample<'_>) {
        let corrected = s.end.saturating_duration_since(s.intended);
        let uncorrected = s.end.saturating_duration_since(s.actual);
        let lag = s.actual.saturating_duration_since(s.intended);
        let class = match s.outcome {
            Outcome::Ok => &mut self.ok,
            Outcome::Refused { code, retry_after } => {
                *self.refused_by_code.entry(code.clone()).or_default() += 1;
                if *retry_after {
                    self.retry_after_seen += 1;
                }
                &mut self.refused
            }
            Outcome::Error { kind } => {
                *self.errors_by_kind.entry(kind.clone()).or_default() += 1;
                &mut self.errors
            }
        };
        class.corrected.record(corrected);
        class.uncorrected.record(uncorrected);
        self.all.corrected.record(corrected);
        self.all.uncorrected.record(uncorrected);
        self.send_lag.record(lag);
        self.busy_s += uncorrected.as_secs_f64();
        self.corrected_s += corrected.as_secs_f64();
        self.last_end = Some(self.last_end.map_or(s.end, |e| e.max(s.end)));
        if let Some(t) = &mut self.timeline {
            t.record(s.intended, s.end, s.outcome);
        }

        let ep = self
            .endpoints
            .entry(s.endpoint)
            .or_insert_with(|| EndpointAcc { latency: Hist::coarse(), ..EndpointAcc::default() });
        ep.latency.record(corrected);
        if let Some(t) = s.tenant {
            let acc = self
                .tenants
                .entry(t)
                .or_insert_with(|| TenantAcc { ok_latency: Hist::coarse(), ..TenantAcc::default() });
            acc.sent += 1;
            match s.outcome {
                Outcome::Ok => {
                    acc.ok += 1;
                    acc.ok_latency.record(corrected);
                }
                Outcome::Refused { code, .. } => {
                    acc.refused += 1;
                    *acc.refused_by_code.entry(code.clone()).or_default() += 1;
                }
                Outcome::Error { .. } => acc.errors += 1,
            }
        }
        match s.outcome {
            Outcome::Ok => ep.ok += 1,
            Outcome::Refused { .. } => ep.refused += 1,
            Outcome::Error { .. } => ep.errors += 1,
        }
    }

    pub fn completed(&self) -> u64 {
        self.all.corrected.len()
    }

    pub fn ok_count(&self) -> u64 {
        self.ok.corrected.len()
    }

    pub fn last_end(&self) -> Option<Instant> {
        self.last_end
    }

    pub fn busy_seconds(&self) -> f64 {
        self.busy_s
    }

    pub fn corrected_seconds(&self) -> f64 {
        self.corrected_s
    }

    pub fn ok_stats(&self) -> ClassStats {
        self.ok.stats()
    }

    pub fn refused_stats(&self) -> RefusedStats {
        RefusedStats {
            stats: self.refused.stats(),
            by_code: self.refused_by_code.clone(),
            retry_after_seen: self.retry_after_seen,
        }
    }

    pub fn error_stats(&self) -> ErrorStats {
        ErrorStats { stats: self.errors.stats(), by_kind: self.errors_by_kind.clone() }
    }

    pub fn all_stats(&self) -> ClassStats {
        self.all.stats()
    }

    pub fn send_lag(&self) -> Pcts {
        self.send_lag.summary()
    }

    pub fn endpoint_stats(&self) -> BTreeMap<String, EndpointStats> {
        self.endpoints
            .iter()
            .map(|(k, v)| {
                (
                    (*k).to_owned(),
                    EndpointStats { ok: v.ok, refused: v.refused, errors: v.errors, latency: v.latency.summary() },
                )
            })
            .collect()
    }

    /// Per-tenant counters, keyed by tenant index.
    pub fn tenant_counts(&self) -> Vec<(usize, TenantCounts)> {
        self.tenants
            .iter()
            .map(|(i, t)| {
                (
                    *i,
                    TenantCounts {
                        sent: t.sent,
                        ok: t.ok,
                        refused: t.refused,
                        refused_by_code: t.refused_by_code.clone(),
                        errors: t.errors,
                        ok_latency: t.ok_latency.clone(),
                    },
                )
            })
            .collect()
    }
}

/// Refusals: 429 and typed 503s. The service working as designed, never an error.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct RefusedStats {
    #[serde(flatten)]
    pub stats: ClassStats,
    /// Count per envelope `code` (`load_shed`, `queue_timeout`, `db_saturated`, `rate_limited`, ...).
    pub by_code: BTreeMap<String, u64>,
    /// How many refusals carried a `Retry-After` header.
    pub retry_after_seen: u64,
}

/// Errors: other 5xx, unexpected 4xx, timeouts, resets, unparseable bodies.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ErrorStats {
    #[serde(flatten)]
    pub stats: ClassStats,
    pub by_kind: BTreeMap<String, u64>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct EndpointStats {
    pub ok: u64,
    pub refused: u64,
    pub errors: u64,
    /// Corrected latency of every response from this endpoint.
    pub latency: Pcts,
}

#[derive(Debug, Clone)]
pub struct TenantCounts {
    pub sent: u64,
    pub ok: u64,
    pub refused: u64,
    pub refused_by_code: BTreeMap<String, u64>,
    pub errors: u64,
    pub ok_latency: Hist,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::classify::Outcome;

    #[test]
    fn refusals_are_counted_per_tenant_by_code() {
        let t0 = Instant::now();
        let refused = |code: &str| Outcome::Refused { code: code.into(), retry_after: true };
        let outcomes = [
            (Some(0), Outcome::Ok),
            (Some(0), refused("rate_limited")),
            (Some(0), refused("rate_limited")),
            (Some(1), refused("load_shed")),
            (Some(1), Outcome::error("timeout")),
            (None, refused("load_shed")),
        ];
        let mut rec = StepRecorder::new();
        for (tenant, outcome) in &outcomes {
            rec.record(&Sample { intended: t0, actual: t0, end: t0, outcome, tenant: *tenant, endpoint: "inbox" });
        }
        let counts: BTreeMap<usize, TenantCounts> = rec.tenant_counts().into_iter().collect();
        let codes = |i: usize| counts[&i].refused_by_code.iter().map(|(k, v)| (k.as_str(), *v)).collect::<Vec<_>>();
        assert_eq!((counts[&0].sent, counts[&0].ok, counts[&0].refused), (3, 1, 2));
        assert_eq!(codes(0), [("rate_limited", 2)]);
        assert_eq!((counts[&1].refused, counts[&1].errors), (1, 1));
        assert_eq!(codes(1), [("load_shed", 1)], "an error is not a refusal, and the untagged request is no tenant's");
    }
}
