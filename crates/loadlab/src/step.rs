//! One step of a run as the report records it: what was offered, what came back, and the
//! generator's audit of itself. A module of its own, so that the analysis reads steps without the
//! report it is part of.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::stats::{ClassStats, EndpointStats, ErrorStats, Pcts, RefusedStats};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// Requests sent on a schedule, whatever the responses do.
    Open,
    /// N callers, each waiting for its response before the next request.
    Closed,
}

/// One step of a ramp or sweep, or one stage of a profile.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StepReport {
    pub index: usize,
    pub label: String,
    pub mode: Mode,
    /// Requests per second the schedule offered (open loop).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offered_rps: Option<f64>,
    /// Callers (closed loop).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<usize>,
    /// When the step began, seconds since the run began (aligns a step's `timeline` with
    /// what else was happening).
    #[serde(default)]
    pub started_s: f64,
    /// How long the schedule ran.
    pub duration_s: f64,
    /// From the step's start to its last response (includes draining the queue).
    pub elapsed_s: f64,
    pub sent: u64,
    pub sent_rps: f64,
    pub completed: u64,
    /// Every response per second of `elapsed_s`.
    pub achieved_rps: f64,
    /// Ok responses per second of `elapsed_s`: what saturation is read from.
    pub goodput_rps: f64,
    pub ok: ClassStats,
    pub refused: RefusedStats,
    pub errors: ErrorStats,
    pub all: ClassStats,
    pub refused_share: f64,
    pub error_share: f64,
    /// Actual send time minus intended send time.
    pub send_lag: Pcts,
    #[serde(default)]
    pub endpoints: BTreeMap<String, EndpointStats>,
    pub audit: Audit,
    /// Mean, max and last of every server-side series sampled during the step.
    #[serde(default)]
    pub server: BTreeMap<String, SeriesSummary>,
    /// The logical requests, when the population honoured `Retry-After` (each refused attempt
    /// retried by the policy): attempts per success and time to success.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logical: Option<crate::retry::LogicalReport>,
    /// The step second by second, when the run asked for it (`EngineConfig::timeline`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeline: Option<Vec<crate::timeline::Second>>,
}

/// The generator checking itself: a step where the generator, not the server, was the limit
/// is marked invalid and left out of the knee, saturation and capacity.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Audit {
    pub valid: bool,
    #[serde(default)]
    pub reasons: Vec<String>,
    /// Generator CPU seconds spent during the step (all threads).
    #[serde(default)]
    pub cpu_s: Option<f64>,
    #[serde(default)]
    pub cpu_us_per_request: Option<f64>,
    /// Mean cores the generator used.
    #[serde(default)]
    pub cpu_cores: Option<f64>,
    pub connections_opened: u64,
    pub peak_in_flight: u64,
    #[serde(default)]
    pub in_flight_cap: Option<usize>,
    /// Requests that had to wait for a slot under the cap (the loop went partly closed).
    pub cap_waits: u64,
    pub littles_law: LittlesLaw,
    #[serde(default)]
    pub warnings: Vec<String>,
}

/// L = lambda x W, three ways. A gap between them says where requests queued unseen.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct LittlesLaw {
    /// achieved x mean corrected latency: requests somewhere between intended send and reply.
    pub expected_in_flight: f64,
    /// Time-averaged requests sent and not yet answered, as the generator counted them.
    pub generator_in_flight: f64,
    /// The server's own `in_flight` + `queue_depth`, averaged over the step's samples.
    #[serde(default)]
    pub server_in_flight: Option<f64>,
    #[serde(default)]
    pub hidden_queueing: Option<String>,
}

#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
pub struct SeriesSummary {
    pub mean: f64,
    pub max: f64,
    pub last: f64,
}

/// Milliseconds, human-sized.
pub fn ms(v: f64) -> String {
    if v == 0.0 {
        "-".into()
    } else if v < 10.0 {
        format!("{v:.2}ms")
    } else if v < 1000.0 {
        format!("{v:.0}ms")
    } else {
        format!("{:.2}s", v / 1000.0)
    }
}
