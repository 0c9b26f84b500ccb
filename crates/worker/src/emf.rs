//! The worker's figures as CloudWatch embedded-metric-format lines, for ECS, where nothing
//! scrapes `/metrics` ([`breakwater_telemetry::emf`]; the API does the same, `docs/OPERATIONS.md`).
//!
//! One line per interval, under the dimensions `Environment` and `Service` (`worker`): what became
//! of the jobs this process claimed during the interval, and the jobs it holds at the line's time.
//! The queue's own figures (oldest ready job, dead jobs) come from the API's lines: one reading
//! for the whole fleet.

use std::time::SystemTime;

use breakwater_telemetry::emf::{Line, Source};

use crate::{Counts, Worker};

/// The `Service` dimension of the worker's lines.
pub const SERVICE: &str = "worker";

/// Builds the lines, remembering the totals the previous line was computed from.
#[derive(Debug)]
pub struct Publisher {
    namespace: String,
    environment: String,
    worker: Worker,
    previous: Counts,
}

impl Publisher {
    /// A publisher for `worker` whose first line counts everything since it was created.
    #[must_use]
    pub fn new(namespace: &str, environment: &str, worker: Worker) -> Self {
        Self {
            namespace: namespace.to_owned(),
            environment: environment.to_owned(),
            worker,
            previous: Counts::default(),
        }
    }

    /// The line for the interval since the previous call.
    #[must_use]
    pub fn line(&mut self) -> Line {
        let now = self.worker.counts();
        let before = std::mem::replace(&mut self.previous, now);
        let mut line = Line::new(&self.namespace, SystemTime::now())
            .dimension("Environment", &self.environment)
            .dimension("Service", SERVICE);
        line.count_since("JobsClaimed", now.claimed, before.claimed)
            .count_since("JobsCompleted", now.completed, before.completed)
            .count_since("JobsRetried", now.retried, before.retried)
            .count_since("JobsDead", now.dead, before.dead)
            .count_since("JobsReleased", now.released, before.released)
            .count_since("JobsLeaseLost", now.lease_lost, before.lease_lost)
            .count_since("JobsRescued", now.rescued, before.rescued)
            .count("JobsHeld", self.worker.held_count() as u64);
        line
    }
}

impl Source for Publisher {
    async fn lines(&mut self) -> Vec<Line> {
        vec![self.line()]
    }
}
