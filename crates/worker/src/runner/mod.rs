//! The worker's tasks: claim loop, job tasks, heartbeat, listener, maintenance and completer.
//!
//! [`Worker::run`] starts the background tasks (`background`: heartbeat, listener, maintenance,
//! completer), runs the claim loop (`claim`, which spawns one task per job) until stopped, then
//! shuts down. `counts` holds what the worker did.

mod background;
mod claim;
mod counts;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use breakwater_domain::Pool;
use breakwater_domain::jobs::{self, Lease};
use tokio::sync::{Notify, Semaphore, mpsc};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use uuid::Uuid;

use crate::WorkerOptions;
use crate::client::WebhookClient;
use crate::handlers::Handlers;
use breakwater_telemetry::figures::Figures;

use crate::metrics::{Metrics, Reading};
use background::{complete_loop, heartbeat_loop, listen_loop, maintenance_loop};
use claim::claim_loop;
use counts::Counters;
pub use counts::Counts;

/// A job this process holds a lease on: running, or finished and waiting for the completer.
#[derive(Debug)]
struct Held {
    attempt: i32,
    /// Cancelled when the lease is lost or shutdown's budget runs out.
    cancel: CancellationToken,
}

struct Shared {
    pool: Pool,
    options: WorkerOptions,
    handlers: Handlers,
    counters: Counters,
    metrics: Metrics,
    held: Mutex<HashMap<Uuid, Held>>,
    wake: Notify,
}

impl Shared {
    fn held(&self) -> MutexGuard<'_, HashMap<Uuid, Held>> {
        self.held.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn leases(&self) -> Vec<Lease> {
        self.held().iter().map(|(id, h)| Lease { id: *id, attempt: h.attempt }).collect()
    }

    fn counts(&self) -> Counts {
        self.counters.snapshot(self.handlers.client.counters())
    }
}

/// A worker process's queue runner.
#[derive(Clone)]
pub struct Worker {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Worker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker").field("owner", &self.shared.options.owner).finish_non_exhaustive()
    }
}

impl Worker {
    /// A worker on `pool` (size it for `concurrency` plus a few: jobs, claims and heartbeats use it).
    #[must_use]
    pub fn new(pool: Pool, options: WorkerOptions) -> Self {
        let handlers = Handlers {
            pool: pool.clone(),
            client: WebhookClient::new(options.client.clone()),
            erase_batch: options.erase_batch,
        };
        let metrics = Metrics::new();
        Self {
            shared: Arc::new(Shared {
                pool,
                options,
                handlers,
                counters: Counters::default(),
                metrics,
                held: Mutex::new(HashMap::new()),
                wake: Notify::new(),
            }),
        }
    }

    /// Its lease owner name.
    #[must_use]
    pub fn owner(&self) -> &str {
        &self.shared.options.owner
    }

    /// Jobs it holds now (running, or finished and not yet marked completed).
    #[must_use]
    pub fn held_count(&self) -> usize {
        self.shared.held().len()
    }

    /// What it did so far.
    #[must_use]
    pub fn counts(&self) -> Counts {
        self.shared.counts()
    }

    /// What its figures are read from, now (what `/health` answers with).
    #[must_use]
    pub fn reading(&self) -> Reading {
        Reading { counts: self.counts(), held: self.held_count(), slots: self.shared.options.concurrency.max(1) }
    }

    /// Every figure it publishes, read now: the one list `/metrics`, `/health` and its
    /// CloudWatch lines are views of.
    #[must_use]
    pub fn figures(&self) -> Figures {
        self.shared.metrics.figures(&self.reading())
    }

    /// Its figures as Prometheus text (what [`crate::metrics::serve`] answers `/metrics` with).
    #[must_use]
    pub fn render_metrics(&self) -> String {
        Metrics::render(self.figures())
    }

    /// Runs until `stop` is cancelled, then shuts down gracefully: claims nothing more, gives
    /// running jobs [`WorkerOptions::shutdown_budget`] to finish, interrupts the rest and
    /// releases them to the queue (`run_at = now()`, lease cleared, attempt not counted).
    ///
    /// # Errors
    /// Only when releasing the interrupted jobs fails (they then wait for their lease to expire).
    pub async fn run(&self, stop: CancellationToken) -> anyhow::Result<Counts> {
        let shared = &self.shared;
        let options = &shared.options;
        // Background tasks outlive the claim loop: the heartbeat must keep leases alive while
        // running jobs finish, until they are released.
        let background = CancellationToken::new();
        let (done_tx, done_rx) = mpsc::unbounded_channel::<Lease>();
        let completer = tokio::spawn(complete_loop(Arc::clone(shared), done_rx));
        let heartbeat = tokio::spawn(heartbeat_loop(Arc::clone(shared), background.clone()));
        let listener = tokio::spawn(listen_loop(Arc::clone(shared), background.clone()));
        let maintenance = tokio::spawn(maintenance_loop(Arc::clone(shared), background.clone()));
        tracing::info!(owner = %options.owner, concurrency = options.concurrency, kinds = ?options.kinds, "worker started");

        let slots = Arc::new(Semaphore::new(options.concurrency.max(1)));
        let tasks = TaskTracker::new();
        claim_loop(shared, &slots, &tasks, &done_tx, &stop).await;

        // Shutdown: let running jobs finish within the budget, then interrupt the rest.
        tasks.close();
        let running = options.concurrency.max(1) - slots.available_permits();
        tracing::info!(owner = %options.owner, running, budget = ?options.shutdown_budget, "stopping: no more claims");
        if tokio::time::timeout(options.shutdown_budget, tasks.wait()).await.is_err() {
            for held in shared.held().values() {
                held.cancel.cancel();
            }
            tasks.wait().await;
        }
        drop(done_tx);
        if let Err(e) = completer.await {
            tracing::error!(error = %e, "completer task failed");
        }
        // What is still held was interrupted: give it back for another worker to take at once.
        let leftovers = shared.leases();
        let released =
            if leftovers.is_empty() { Ok(0) } else { jobs::release(&shared.pool, &options.owner, &leftovers).await };
        if released.is_ok() {
            // Given back: no longer this worker's (its figures say it holds nothing).
            let mut held = shared.held();
            for lease in &leftovers {
                held.remove(&lease.id);
            }
        }
        background.cancel();
        for task in [heartbeat, listener, maintenance] {
            let _ = task.await;
        }
        let released = released?;
        Counters::add(&shared.counters.released, released);
        let counts = shared.counts();
        tracing::info!(owner = %options.owner, released, ?counts, "worker stopped");
        Ok(counts)
    }
}
