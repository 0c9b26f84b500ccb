//! The worker's figures as CloudWatch embedded-metric-format lines, for ECS, where nothing
//! scrapes `/metrics` ([`breakwater_telemetry::emf`]; the API does the same, `docs/OPERATIONS.md`).
//!
//! One line per interval, under the dimensions `Environment` and `Service` (`worker`): what became
//! of the jobs this process claimed during the interval, and the jobs it holds at the line's time.
//! The queue's own figures (oldest ready job, dead jobs) come from the API's lines: one reading
//! for the whole fleet.

use std::time::SystemTime;

use breakwater_telemetry::emf::{Line, Source};
use breakwater_telemetry::figures::to_emf::EmfPublisher;

use crate::Worker;

/// The `Service` dimension of the worker's lines.
pub const SERVICE: &str = "worker";

/// Builds the lines from the worker's figures ([`Worker::figures`]), remembering the totals the
/// previous line was computed from.
#[derive(Debug)]
pub struct Publisher {
    publisher: EmfPublisher,
    worker: Worker,
}

impl Publisher {
    /// A publisher for `worker` whose first line counts everything since it was created.
    #[must_use]
    pub fn new(namespace: &str, environment: &str, worker: Worker) -> Self {
        Self { publisher: EmfPublisher::new(namespace, environment, SERVICE), worker }
    }

    /// The line for the interval since the previous call.
    #[must_use]
    pub fn line(&mut self) -> Line {
        let mut lines = self.publisher.lines_of(&self.worker.figures(), SystemTime::now());
        // The worker's figures have no admission class: the task's line is the only one.
        lines.swap_remove(0)
    }
}

impl Source for Publisher {
    async fn lines(&mut self) -> Vec<Line> {
        vec![self.line()]
    }
}
