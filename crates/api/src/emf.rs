//! CloudWatch metrics without an agent: with `METRICS_EMF_INTERVAL_SECS` set, the API writes its
//! figures to stdout every interval as CloudWatch embedded-metric-format lines
//! ([`breakwater_telemetry::emf`]). On ECS the `awslogs` driver carries them to CloudWatch Logs,
//! which turns them into metrics; the alarms in `infra/cloudformation/alarms.yaml` watch those.
//! Nothing on ECS scrapes `/metrics`, and a collector sidecar would take CPU from a task sized
//! at a quarter of a core.
//!
//! Each interval writes one line for the task (dimensions `Environment`, `Service`) and one per
//! admission class (plus `Class`). Counters are published as what happened during the interval
//! (CloudWatch sums them across tasks and periods); gauges as their value at the line's time.
//! The last line is written after the server has drained, so a stopping task's final requests
//! are counted too.

use std::time::SystemTime;

use breakwater_telemetry::emf::{Line, Source};
use breakwater_telemetry::figures::to_emf::EmfPublisher;

use crate::state::AppState;

/// The `Service` dimension of the API's lines.
pub const SERVICE: &str = "api";

/// Builds the API's lines from its figures ([`EmfPublisher`]).
#[derive(Debug)]
pub struct Publisher(EmfPublisher);

impl Publisher {
    /// A publisher whose first lines count everything since the process started.
    #[must_use]
    pub fn new(namespace: &str, environment: &str) -> Self {
        Self(EmfPublisher::new(namespace, environment, SERVICE))
    }

    /// The lines for the interval since the previous call: the task's, then one per admission
    /// class. Reads the job queue's figures through their cache (a query at most every
    /// `JOBS_STATS_TTL_MS`, never longer than `JOBS_STATS_TIMEOUT_MS`).
    pub async fn lines(&mut self, state: &AppState) -> Vec<Line> {
        let queue = state.queue_stats.get(&state.pool).await;
        self.0.lines_of(&crate::figures::read(state, queue), SystemTime::now())
    }
}

/// The API's [`Source`]: its publisher and the state it reads.
#[derive(Debug)]
pub(crate) struct ApiSource {
    publisher: Publisher,
    state: AppState,
}

impl ApiSource {
    /// Lines in the namespace and environment of the state's configuration.
    pub(crate) fn new(state: AppState) -> Self {
        let options = &state.config.metrics_emf;
        Self { publisher: Publisher::new(&options.namespace, &options.environment), state }
    }
}

impl Source for ApiSource {
    async fn lines(&mut self) -> Vec<Line> {
        self.publisher.lines(&self.state).await
    }
}
