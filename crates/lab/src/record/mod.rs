//! What a lab run measured, as `lab.json` holds it: the run's [`LabRecord`] with its machine,
//! plan and capacity, and per admission variant the rows of every step (the load lab's figures
//! with the server-side samples of the step's window), the capacity change, the noisy neighbour
//! and the flood. [`reading`] derives these from a run's raw reports; nothing here touches the
//! machine, so a committed `lab.json` reads the same anywhere.

use std::collections::BTreeMap;

use breakwater_loadlab::report::Report;
use serde::{Deserialize, Serialize};

use crate::plan::Plan;
use crate::rig::pinned::Stats;

pub mod reading;

#[cfg(test)]
pub(crate) mod fixtures;

/// Bumped when a field of `lab.json` changes meaning.
pub(crate) const SCHEMA: &str = "breakwater-lab/1";

/// The latency objective of every goal: admitted (2xx) p99.
pub(crate) const SLO_MS: f64 = 200.0;

/// A whole lab run, as written to `lab.json` (what `lab` measured; the report reads nothing else).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct LabRecord {
    pub(crate) schema: String,
    /// When it ran (RFC 3339, UTC).
    pub(crate) date: String,
    pub(crate) machine: Machine,
    pub(crate) commit: String,
    pub(crate) seed: String,
    pub(crate) database: String,
    pub(crate) plan: Plan,
    pub(crate) capacity: Option<Capacity>,
    pub(crate) variants: Vec<Variant>,
    /// The noisy tenant's normal share of the traffic (the heaviest tenant's).
    pub(crate) noisy_tenant_share: f64,
    /// What a refusal costs, against a bare hyper server's canned 503 (lab files written before
    /// it was measured have none).
    #[serde(default)]
    pub(crate) refusal_cost: Option<RefusalCost>,
    pub(crate) wall_s: f64,
}

/// CPU per refusal of a server that refuses everything, on kept-alive and on new connections:
/// the API (`ADMISSION_STATIC_LIMIT=0`) and the floor, a bare hyper server answering the same
/// bytes. The cgroup's CPU over the step divided by the refusals.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct RefusalCost {
    pub(crate) api_kept_alive: Option<Row>,
    pub(crate) api_new_connections: Option<Row>,
    pub(crate) floor_kept_alive: Option<Row>,
    pub(crate) floor_new_connections: Option<Row>,
}

impl RefusalCost {
    pub(crate) fn record(&mut self, server: &str, new_connections: bool, row: Option<Row>) {
        let slot = match (server, new_connections) {
            ("api", false) => &mut self.api_kept_alive,
            ("api", true) => &mut self.api_new_connections,
            (_, false) => &mut self.floor_kept_alive,
            (_, true) => &mut self.floor_new_connections,
        };
        *slot = row;
    }

    /// Microseconds of the server's CPU per refusal in a step.
    pub(crate) fn us_per_refusal(row: Option<&Row>) -> Option<f64> {
        let r = row?;
        let refused_rps = r.achieved_rps * r.refused_share;
        (refused_rps > 0.0).then(|| r.api_cpu_cores.map(|c| c / refused_rps * 1e6)).flatten()
    }

    /// The API's CPU per refusal over the floor's, kept alive and on new connections.
    pub(crate) fn ratios(&self) -> (Option<f64>, Option<f64>) {
        let ratio = |a: &Option<Row>, f: &Option<Row>| {
            Self::us_per_refusal(a.as_ref()).zip(Self::us_per_refusal(f.as_ref())).map(|(a, f)| a / f)
        };
        (
            ratio(&self.api_kept_alive, &self.floor_kept_alive),
            ratio(&self.api_new_connections, &self.floor_new_connections),
        )
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Machine {
    pub(crate) cores: usize,
    pub(crate) cpu_model: String,
    pub(crate) kernel: String,
    /// `v1`, `v2`, or `none`.
    pub(crate) cgroup: String,
    /// Why the API ran unpinned (quick mode only), when it did.
    pub(crate) unpinned: Option<String>,
    /// `/proc/loadavg` when the run started and when it ended: how busy the machine was besides.
    pub(crate) load_average: (String, String),
}

/// The capacity the ramps are scaled to, measured once.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Capacity {
    pub(crate) rps: f64,
    pub(crate) how: String,
    pub(crate) calibration: Vec<Row>,
}

/// One admission variant's results.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct Variant {
    pub(crate) name: String,
    pub(crate) sweep: Vec<Row>,
    /// The same sweep, with callers that honour `Retry-After`.
    #[serde(default)]
    pub(crate) sweep_honouring: Vec<Row>,
    /// The same sweep, all from the heaviest tenant's tokens.
    #[serde(default)]
    pub(crate) sweep_one: Vec<Row>,
    pub(crate) ramp: Vec<Row>,
    /// The same ramp, all from the heaviest tenant's tokens.
    #[serde(default)]
    pub(crate) ramp_one: Vec<Row>,
    /// Open-loop clients that honour `Retry-After`, past capacity.
    #[serde(default)]
    pub(crate) ramp_honouring: Vec<Row>,
    pub(crate) change: Change,
    pub(crate) noisy: Option<Noisy>,
    /// One tenant flooding over its throttle beside the others.
    #[serde(default)]
    pub(crate) flood: Option<Flood>,
    /// The cgroup's peak memory over all its runs (page cache included, as the kernel counts it).
    pub(crate) peak_rss_bytes: Option<u64>,
    /// Processes the OOM killer ended in the API's cgroup, over all its runs.
    pub(crate) oom_kills: Option<u64>,
}

/// One step, with the server-side figures of its window and what saturated.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct Row {
    pub(crate) label: String,
    pub(crate) offered_rps: Option<f64>,
    /// Offered rate over the measured capacity (ramps).
    pub(crate) multiple: Option<f64>,
    pub(crate) callers: Option<usize>,
    pub(crate) elapsed_s: f64,
    pub(crate) completed: u64,
    pub(crate) ok: u64,
    pub(crate) refused: u64,
    pub(crate) achieved_rps: f64,
    /// 2xx per second.
    pub(crate) ok_rps: f64,
    /// 2xx per second, counted only when the step's admitted p99 meets 200 ms.
    pub(crate) goodput_rps: f64,
    pub(crate) ok_p50_ms: f64,
    pub(crate) ok_p99_ms: f64,
    pub(crate) shed_p50_ms: Option<f64>,
    pub(crate) refused_share: f64,
    pub(crate) error_share: f64,
    pub(crate) refusal_codes: BTreeMap<String, u64>,
    pub(crate) error_kinds: BTreeMap<String, u64>,
    pub(crate) valid: bool,
    pub(crate) invalid: Vec<String>,
    pub(crate) limit_mean: Option<f64>,
    pub(crate) in_flight_mean: Option<f64>,
    pub(crate) api_cpu_cores: Option<f64>,
    pub(crate) api_cpu_s: Option<f64>,
    /// Share of CFS periods in which the API's cgroup was throttled.
    pub(crate) throttled_share: Option<f64>,
    /// CPU of every PostgreSQL process on the machine (the competing load's included), in cores.
    pub(crate) postgres_cpu_cores: Option<f64>,
    /// The whole machine's busy share (all cores).
    pub(crate) machine_busy: Option<f64>,
    pub(crate) pg_active_mean: Option<f64>,
    pub(crate) pool_waiting_mean: Option<f64>,
    /// `db_saturated` refusals during the step (bulkhead acquire timeouts).
    pub(crate) pool_timeouts: Option<f64>,
    /// Connections refused (canned 503) or reset at accept, past the edge's cap, during the step.
    #[serde(default)]
    pub(crate) edge_refused: Option<f64>,
    pub(crate) rss_max_bytes: Option<f64>,
    pub(crate) health_probes: usize,
    pub(crate) health_failures: usize,
    pub(crate) health_max_ms: Option<f64>,
    pub(crate) saturated: Vec<String>,
    /// For a population that honours `Retry-After`: its logical requests.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) logical: Option<breakwater_loadlab::retry::LogicalReport>,
}

/// What `lab` sampled beside the load lab, once per interval.
#[derive(Debug, Clone)]
pub(crate) struct XSample {
    /// Seconds since the phase's sampler started.
    pub(crate) t_s: f64,
    pub(crate) cgroup: Option<Stats>,
    /// CPU seconds of each PostgreSQL process, by pid (backends come and go: a sum alone would
    /// drop when one exits).
    pub(crate) postgres_cpu_s: Option<BTreeMap<u32, f64>>,
    /// (busy, total) jiffies of the whole machine.
    pub(crate) machine: Option<(u64, u64)>,
    pub(crate) pg_active: Option<i64>,
    /// `/health` latency, or `None` when it did not answer 200 within a second.
    pub(crate) health_ms: Option<f64>,
}

/// The competing load of a capacity-change run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct BurnRecord {
    pub(crate) connections: usize,
    pub(crate) queries: u64,
    pub(crate) mean_query_ms: Option<f64>,
}

/// The CPU quota put on the API database's PostgreSQL backends in a capacity-change run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct DbCapRecord {
    /// The quota, in cores.
    pub(crate) cpus: f64,
    /// Backends moved under it.
    pub(crate) backends: usize,
    /// Share of the quota's periods that ended throttled.
    pub(crate) throttled_share: f64,
    /// CPU the backends used under the quota, in cores.
    pub(crate) cpu_cores: Option<f64>,
}

/// One load against one API process.
#[derive(Debug)]
pub(crate) struct PhaseRun {
    pub(crate) name: String,
    pub(crate) report: Report,
    /// The flooding tenant's own load, in a flood run.
    pub(crate) flooder: Option<Report>,
    /// When each step's progress line arrived (the step's end), on the sampler's clock.
    pub(crate) step_ends: Vec<f64>,
    pub(crate) samples: Vec<XSample>,
    pub(crate) cgroup_peak: Option<u64>,
    pub(crate) cgroup_oom_kills: Option<u64>,
    pub(crate) burn: Option<BurnRecord>,
    pub(crate) db_cap: Option<DbCapRecord>,
}

/// The capacity-change run of one variant.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct Change {
    pub(crate) phases: Vec<Row>,
    /// (seconds, admission limit, in flight) from the load lab's samples of `/v1/ops/status`.
    pub(crate) timeline: Vec<(f64, Option<f64>, f64)>,
    /// When PostgreSQL was slowed, on the same clock.
    pub(crate) slowed: Option<(f64, f64)>,
    pub(crate) burn: Option<BurnRecord>,
    /// Lab files written before the quota existed have none.
    #[serde(default)]
    pub(crate) db_cap: Option<DbCapRecord>,
}

/// The noisy-neighbour run of one variant.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Noisy {
    pub(crate) tenant: String,
    pub(crate) offered_rps: f64,
    pub(crate) noisy_sent: u64,
    pub(crate) noisy_ok: u64,
    pub(crate) noisy_refused: u64,
    pub(crate) quiet_tenants: usize,
    pub(crate) quiet_sent: u64,
    pub(crate) quiet_ok: u64,
    pub(crate) quiet_refused: u64,
    /// The quiet tenants' refusals per envelope code (lab files written before the load lab
    /// counted codes per tenant have none).
    #[serde(default)]
    pub(crate) quiet_refused_by_code: BTreeMap<String, u64>,
    pub(crate) quiet_errors: u64,
    pub(crate) quiet_success: f64,
    /// The worst quiet tenant's admitted p99 (over its users' p99s, the highest).
    pub(crate) quiet_p99_worst_ms: f64,
    /// The quiet tenants' admitted p99s, weighted by their requests.
    pub(crate) quiet_p99_weighted_ms: f64,
    pub(crate) row: Row,
}

/// The flood run of one variant: the heaviest tenant's closed loop over its own throttle, the
/// others at their normal rate.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Flood {
    pub(crate) tenant: String,
    /// The flooding tenant's plan: requests a second (and as many at once).
    pub(crate) tenant_rate: f64,
    pub(crate) callers: usize,
    pub(crate) flooder_sent: u64,
    pub(crate) flooder_ok: u64,
    pub(crate) flooder_refused_by_code: BTreeMap<String, u64>,
    pub(crate) others: Noisy,
    /// The shed-rate alarm's figure over the run: admission's refusals over its refusals and
    /// admissions, in percent (it pages above 5 for 8 minutes of 10).
    pub(crate) shed_percent: Option<f64>,
}

impl Flood {
    /// Of the flooder's refusals, the share that were 429 `rate_limited`.
    #[allow(clippy::cast_precision_loss)]
    pub(crate) fn flooder_429_share(&self) -> f64 {
        let refused: u64 = self.flooder_refused_by_code.values().sum();
        let limited = self.flooder_refused_by_code.get("rate_limited").copied().unwrap_or(0);
        if refused == 0 { 0.0 } else { limited as f64 / refused as f64 }
    }
}
