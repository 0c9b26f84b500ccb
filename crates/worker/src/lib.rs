//! Breakwater's worker: runs the PostgreSQL job queue of `breakwater_domain::jobs`.
//!
//! One [`Worker`] per process: a claim loop that leases due jobs in batches (`FOR UPDATE SKIP
//! LOCKED`) up to its free slots ([`WorkerOptions::concurrency`]) and runs each in its own
//! task; a heartbeat that extends the leases of running jobs; a listener woken by
//! `LISTEN breakwater_jobs` (polling is the fallback); a maintenance task that rescues jobs
//! whose lease expired and prunes finished ones; and a completer that marks finished jobs done
//! in batches. On stop it claims nothing more, lets running jobs finish within a budget, then
//! releases the rest to the queue. `docs/WORKER.md` has the guarantees and their limits.
//! [`metrics::serve`] publishes the process's figures on `/metrics`, with `/health`; [`emf`]
//! writes them as CloudWatch embedded-metric-format lines (ECS, where nothing scrapes).
//!
//! Architecture invariant: the worker talks to PostgreSQL through `breakwater_domain` only.

pub mod backoff;
pub mod client;
pub mod emf;
pub mod handlers;
pub mod metrics;
mod runner;
pub mod settings;

use std::time::Duration;

use breakwater_domain::jobs::kind;
use uuid::Uuid;

pub use backoff::Backoff;
pub use client::{ClientOptions, WebhookClient};
pub use runner::{Counts, Worker};

/// How a worker process runs.
#[derive(Debug, Clone)]
pub struct WorkerOptions {
    /// Lease owner name, unique per process (it fences every update the worker makes).
    pub owner: String,
    /// The job kinds this process claims.
    pub kinds: Vec<String>,
    /// Jobs run at once by this process.
    pub concurrency: usize,
    /// Most jobs claimed in one statement (never more than the free slots).
    pub batch: usize,
    /// How long a claimed job is leased; heartbeats extend it while the job runs. A worker that
    /// dies holds its jobs this long before the rescuer returns them.
    pub lease: Duration,
    /// How often running jobs' leases are extended (well under `lease`).
    pub heartbeat: Duration,
    /// How often an idle worker polls when no notification arrives.
    pub poll_interval: Duration,
    /// How often expired leases are looked for.
    pub rescue_interval: Duration,
    /// How often finished jobs are pruned.
    pub prune_interval: Duration,
    /// How long completed jobs are kept.
    pub completed_retention: Duration,
    /// How long dead jobs are kept (with their last error) for inspection.
    pub dead_retention: Duration,
    /// How long a message's `Idempotency-Key` is remembered; a retry after it is a new request.
    pub idempotency_retention: Duration,
    /// How long the live inbox's events are kept for clients that resume (`Last-Event-ID`).
    pub stream_retention: Duration,
    /// Most live-inbox events kept per tenant, however young.
    pub stream_keep_per_tenant: i64,
    /// On stop, how long running jobs get to finish before they are interrupted and released.
    /// Keep it below the container's stop timeout.
    pub shutdown_budget: Duration,
    /// The longest one attempt may run.
    pub job_timeout: Duration,
    /// Retry delays.
    pub backoff: Backoff,
    /// Rows deleted per statement by an erasure.
    pub erase_batch: i64,
    /// The webhook client.
    pub client: ClientOptions,
    /// Stop once a claim finds nothing due and nothing is running (benchmarks, one-off drains).
    pub exit_when_idle: bool,
}

/// Every job kind this worker can run.
#[must_use]
pub fn all_kinds() -> Vec<String> {
    [kind::ERASE_CONTACT, kind::DELIVER_MESSAGE, kind::NOOP].map(String::from).to_vec()
}

/// A lease owner name: process id plus a random suffix.
#[must_use]
pub fn owner_name() -> String {
    let suffix = Uuid::new_v4().simple().to_string();
    format!("worker-{}-{}", std::process::id(), &suffix[..8])
}

impl Default for WorkerOptions {
    /// The same defaults as the flags ([`settings::defaults`]).
    fn default() -> Self {
        use settings::defaults as d;
        Self {
            owner: owner_name(),
            kinds: all_kinds(),
            concurrency: d::CONCURRENCY,
            batch: d::BATCH,
            lease: Duration::ZERO,
            heartbeat: Duration::ZERO,
            poll_interval: Duration::from_millis(d::POLL_MS),
            rescue_interval: Duration::ZERO,
            prune_interval: Duration::from_secs(d::PRUNE_SECS),
            completed_retention: Duration::from_secs(d::COMPLETED_RETENTION_SECS),
            dead_retention: Duration::from_secs(d::DEAD_RETENTION_SECS),
            idempotency_retention: Duration::from_secs(d::IDEMPOTENCY_RETENTION_SECS),
            stream_retention: Duration::from_secs(d::STREAM_RETENTION_SECS),
            stream_keep_per_tenant: d::STREAM_KEEP_PER_TENANT,
            shutdown_budget: Duration::from_secs(d::SHUTDOWN_BUDGET_SECS),
            job_timeout: Duration::from_secs(d::JOB_TIMEOUT_SECS),
            backoff: Backoff::default(),
            erase_batch: breakwater_domain::contacts::ERASE_BATCH,
            client: ClientOptions::default(),
            exit_when_idle: false,
        }
        .with_lease(Duration::from_millis(d::LEASE_MS))
    }
}

impl WorkerOptions {
    /// Sets the lease, and the heartbeat (a third of it) and the rescue interval (a quarter of
    /// it) that follow from it.
    #[must_use]
    pub fn with_lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self.heartbeat = lease / 3;
        self.rescue_interval = (lease / 4).max(Duration::from_millis(50));
        self
    }
}
