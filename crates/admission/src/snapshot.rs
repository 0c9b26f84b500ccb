//! Live figures for `/v1/ops/status` and `/metrics`: plain serializable data.

use serde::Serialize;

use crate::config::{AdmissionConfig, Algorithm, Mode};
use crate::histogram::Histogram;

/// Refusals since start, by reason.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ShedTotals {
    /// Queue full, or pushed out of it by a lighter tenant (`load_shed`).
    pub queue_full: u64,
    /// Waited the longest allowed (`queue_timeout`).
    pub queue_timeout: u64,
    /// The client's deadline could not be met (`queue_timeout` at the door).
    pub deadline: u64,
}

impl ShedTotals {
    /// All refusals.
    #[must_use]
    pub fn total(&self) -> u64 {
        self.queue_full + self.queue_timeout + self.deadline
    }

    fn add(&mut self, other: &Self) {
        self.queue_full += other.queue_full;
        self.queue_timeout += other.queue_timeout;
        self.deadline += other.deadline;
    }
}

/// How busy admission is and how it has fared: one class's figures (`ClassSnapshot::load`), or
/// all classes' combined (`Snapshot::load`). Serialized flat into either.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Load {
    /// Requests holding a slot (their response body not yet fully sent).
    pub in_flight: usize,
    /// Most requests ever in flight at once (combined: the sum of the classes').
    pub high_water: usize,
    /// Requests waiting for a slot.
    pub queue_depth: usize,
    /// The queue's bound (combined: the sum of the bounds).
    pub queue_capacity: usize,
    /// Longest wait allowed in the queue, milliseconds (combined: the longest any class allows).
    pub max_queue_wait_ms: f64,
    /// The p95 latency target, milliseconds (combined: the default class's).
    pub latency_target_ms: f64,
    /// Requests admitted since start.
    pub admitted_total: u64,
    /// Requests refused since start, by reason.
    pub shed: ShedTotals,
    /// Median latency of admitted requests (admission to end of body) over the last 10-20 s,
    /// milliseconds.
    pub p50_ms: Option<f64>,
    /// 95th percentile of the same.
    pub p95_ms: Option<f64>,
}

/// One route class.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ClassSnapshot {
    /// The class's configured name.
    pub name: String,
    /// In-flight ceiling now (`None` when admission is off).
    pub limit: Option<usize>,
    /// The controller's unrounded estimate (differs from `limit` during a baseline probe).
    pub limit_estimate: Option<f64>,
    /// The class's in-flight, queue, admissions, refusals and latency.
    #[serde(flatten)]
    pub load: Load,
    /// The gradient controller's estimate of the no-load latency, milliseconds.
    pub baseline_ms: Option<f64>,
    /// Completions per second in the last controller window.
    pub throughput_per_sec: f64,
    /// The longest `Retry-After` the class's refusals give, seconds.
    pub longest_retry_after_seconds: u32,
}

/// Everything admission knows, for `/v1/ops/status` (serialize it) and `/metrics`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Snapshot {
    /// Adaptive, static or off.
    pub mode: Mode,
    /// The adaptive algorithm (reported even when the mode does not use it).
    pub algorithm: Algorithm,
    /// Sum of the class limits (`None` when off).
    pub limit: Option<usize>,
    /// All classes' figures combined.
    #[serde(flatten)]
    pub load: Load,
    /// Requests that bypassed admission (health, readiness, metrics, ops).
    pub bypassed_total: u64,
    /// Per class.
    pub classes: Vec<ClassSnapshot>,
}

impl Snapshot {
    pub(crate) fn from_classes(
        cfg: &AdmissionConfig,
        classes: Vec<ClassSnapshot>,
        bypassed_total: u64,
        all: &Histogram,
    ) -> Self {
        let loads = || classes.iter().map(|c| &c.load);
        let mut shed = ShedTotals::default();
        for l in loads() {
            shed.add(&l.shed);
        }
        let ms = |q| all.quantile(q).map(|d| d.as_secs_f64() * 1e3);
        Self {
            mode: cfg.mode,
            algorithm: cfg.algorithm,
            limit: classes.iter().map(|c| c.limit).sum(),
            load: Load {
                in_flight: loads().map(|l| l.in_flight).sum(),
                high_water: loads().map(|l| l.high_water).sum(),
                queue_depth: loads().map(|l| l.queue_depth).sum(),
                queue_capacity: loads().map(|l| l.queue_capacity).sum(),
                max_queue_wait_ms: loads().map(|l| l.max_queue_wait_ms).fold(0.0, f64::max),
                latency_target_ms: loads().next().map_or(0.0, |l| l.latency_target_ms),
                admitted_total: loads().map(|l| l.admitted_total).sum(),
                shed,
                p50_ms: ms(0.5),
                p95_ms: ms(0.95),
            },
            bypassed_total,
            classes,
        }
    }
}
