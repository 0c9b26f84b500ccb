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

/// One route class.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ClassSnapshot {
    /// The class's configured name.
    pub name: String,
    /// In-flight ceiling now (`None` when admission is off).
    pub limit: Option<usize>,
    /// The controller's unrounded estimate (differs from `limit` during a baseline probe).
    pub limit_estimate: Option<f64>,
    /// Requests holding a slot (their response body not yet fully sent).
    pub in_flight: usize,
    /// Most requests ever in flight at once.
    pub high_water: usize,
    /// Requests waiting for a slot.
    pub queue_depth: usize,
    /// The queue's bound.
    pub queue_capacity: usize,
    /// Longest wait allowed in the queue, milliseconds.
    pub max_queue_wait_ms: f64,
    /// The p95 latency target, milliseconds.
    pub latency_target_ms: f64,
    /// Requests admitted since start.
    pub admitted_total: u64,
    /// Requests refused since start.
    pub shed: ShedTotals,
    /// Median latency of admitted requests (admission to end of body) over the last 10-20 s.
    pub p50_ms: Option<f64>,
    /// 95th percentile of the same.
    pub p95_ms: Option<f64>,
    /// The gradient controller's estimate of the no-load latency, milliseconds.
    pub baseline_ms: Option<f64>,
    /// Completions per second in the last controller window.
    pub throughput_per_sec: f64,
}

/// Everything admission knows, for `/v1/ops/status` (serialize it) and `/metrics`.
// Many fields repeat `ClassSnapshot`'s on purpose: they are the same figures summed over the
// classes, read as `snapshot.in_flight` and serialized flat; a shared nested struct would move
// every one of them in the API's JSON and in every reader.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Snapshot {
    /// Adaptive, static or off.
    pub mode: Mode,
    /// The adaptive algorithm (reported even when the mode does not use it).
    pub algorithm: Algorithm,
    /// Sum of the class limits (`None` when off).
    pub limit: Option<usize>,
    /// Requests holding a slot, all classes.
    pub in_flight: usize,
    /// Sum of the class high-water marks.
    pub high_water: usize,
    /// Requests waiting, all classes.
    pub queue_depth: usize,
    /// Sum of the queue bounds.
    pub queue_capacity: usize,
    /// The longest queue wait any class allows, milliseconds.
    pub max_queue_wait_ms: f64,
    /// The default class's p95 latency target, milliseconds.
    pub latency_target_ms: f64,
    /// Requests admitted since start, all classes.
    pub admitted_total: u64,
    /// Requests that bypassed admission (health, readiness, metrics, ops).
    pub bypassed_total: u64,
    /// Refusals since start, all classes, by reason.
    pub shed: ShedTotals,
    /// Median latency of admitted requests over the last 10-20 s, all classes, milliseconds.
    pub p50_ms: Option<f64>,
    /// 95th percentile of the same.
    pub p95_ms: Option<f64>,
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
        let mut shed = ShedTotals::default();
        for c in &classes {
            shed.add(&c.shed);
        }
        let ms = |q| all.quantile(q).map(|d| d.as_secs_f64() * 1e3);
        Self {
            mode: cfg.mode,
            algorithm: cfg.algorithm,
            limit: classes.iter().map(|c| c.limit).sum(),
            in_flight: classes.iter().map(|c| c.in_flight).sum(),
            high_water: classes.iter().map(|c| c.high_water).sum(),
            queue_depth: classes.iter().map(|c| c.queue_depth).sum(),
            queue_capacity: classes.iter().map(|c| c.queue_capacity).sum(),
            max_queue_wait_ms: classes.iter().map(|c| c.max_queue_wait_ms).fold(0.0, f64::max),
            latency_target_ms: classes.first().map_or(0.0, |c| c.latency_target_ms),
            admitted_total: classes.iter().map(|c| c.admitted_total).sum(),
            bypassed_total,
            shed,
            p50_ms: ms(0.5),
            p95_ms: ms(0.95),
            classes,
        }
    }
}
