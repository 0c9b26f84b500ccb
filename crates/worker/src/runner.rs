//! The worker's tasks: claim loop, job tasks, heartbeat, listener, maintenance and completer.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use breakwater_domain::Pool;
use breakwater_domain::jobs::{self, ClaimedJob, JobState, Lease};
use serde::{Deserialize, Serialize};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, mpsc};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument as _;
use uuid::Uuid;

use crate::WorkerOptions;
use crate::client::{ClientCounts, WebhookClient};
use crate::handlers::{Handlers, JobError};
use crate::metrics::{Metrics, Outcome};

/// Most leases marked completed in one statement.
const COMPLETE_BATCH: usize = 1_000;
/// How long a saturated worker waits for more free slots before claiming (claims stay batched).
const CLAIM_COOLDOWN: Duration = Duration::from_millis(5);
/// Most expired leases rescued, or finished jobs pruned, per statement.
const MAINTENANCE_BATCH: i64 = 1_000;

/// What a worker did (returned by [`Worker::run`], and logged).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counts {
    /// Jobs claimed.
    pub claimed: u64,
    /// Jobs completed.
    pub completed: u64,
    /// Failed attempts sent back to the queue with a backoff.
    pub retried: u64,
    /// Jobs that went dead here.
    pub dead: u64,
    /// Jobs released unfinished at shutdown.
    pub released: u64,
    /// Jobs whose lease this worker lost (expired and rescued elsewhere) while running them.
    pub lease_lost: u64,
    /// Other workers' jobs with expired leases that this worker's rescuer returned to the queue.
    pub rescued: u64,
    /// Finished jobs pruned by this worker.
    pub pruned: u64,
    /// Idempotency keys past their retention deleted by this worker.
    pub keys_pruned: u64,
    /// Live-inbox events past their retention (by age or per-tenant count) deleted by this worker.
    pub stream_events_pruned: u64,
    /// The webhook client's figures.
    pub client: ClientCounts,
}

#[derive(Debug, Default)]
struct Counters {
    claimed: AtomicU64,
    completed: AtomicU64,
    retried: AtomicU64,
    dead: AtomicU64,
    released: AtomicU64,
    lease_lost: AtomicU64,
    rescued: AtomicU64,
    pruned: AtomicU64,
    keys_pruned: AtomicU64,
    stream_events_pruned: AtomicU64,
}

impl Counters {
    fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    fn snapshot(&self, client: ClientCounts) -> Counts {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        Counts {
            claimed: get(&self.claimed),
            completed: get(&self.completed),
            retried: get(&self.retried),
            dead: get(&self.dead),
            released: get(&self.released),
            lease_lost: get(&self.lease_lost),
            rescued: get(&self.rescued),
            pruned: get(&self.pruned),
            keys_pruned: get(&self.keys_pruned),
            stream_events_pruned: get(&self.stream_events_pruned),
            client,
        }
    }
}

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
        let metrics = Metrics::new(options.concurrency.max(1));
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

    /// Its figures as Prometheus text (what [`crate::metrics::serve`] answers `/metrics` with).
    #[must_use]
    pub fn render_metrics(&self) -> String {
        self.shared.metrics.render(|| (self.shared.counts(), self.shared.held().len()))
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

async fn claim_loop(
    shared: &Arc<Shared>,
    slots: &Arc<Semaphore>,
    tasks: &TaskTracker,
    done: &mpsc::UnboundedSender<Lease>,
    stop: &CancellationToken,
) {
    let options = &shared.options;
    let lease_seconds = options.lease.as_secs_f64();
    loop {
        // Wait for a free slot, then take every free slot up to the batch size: a worker never
        // claims a job it has no slot for (the job would sit leased but not running).
        let mut permit = tokio::select! {
            biased;
            () = stop.cancelled() => return,
            permit = Arc::clone(slots).acquire_owned() => match permit { Ok(p) => p, Err(_) => return },
        };
        let batch = options.batch.clamp(1, options.concurrency.max(1));
        if slots.available_permits() + 1 < batch / 2 {
            // Saturated: slots free up one by one. Wait a moment for half a batch, so that one
            // claim statement fetches many jobs instead of one round trip per freed slot.
            let half = u32::try_from(batch / 2 - 1).unwrap_or(u32::MAX);
            if let Ok(Ok(more)) = tokio::time::timeout(CLAIM_COOLDOWN, Arc::clone(slots).acquire_many_owned(half)).await
            {
                permit.merge(more);
            }
        }
        let extra = slots.available_permits().min(batch - permit.num_permits());
        if extra > 0
            && let Ok(more) = Arc::clone(slots).try_acquire_many_owned(u32::try_from(extra).unwrap_or(u32::MAX))
        {
            permit.merge(more);
        }
        let wanted = permit.num_permits();
        #[allow(clippy::cast_possible_wrap)] // at most `batch` jobs
        let claimed =
            match jobs::claim(&shared.pool, &options.owner, &options.kinds, wanted as i64, lease_seconds).await {
                Ok(claimed) => claimed,
                Err(e) => {
                    tracing::warn!(error = %e, "claiming failed; retrying after the poll interval");
                    drop(permit);
                    idle(shared, stop).await;
                    continue;
                }
            };
        let got = claimed.len();
        Counters::add(&shared.counters.claimed, got as u64);
        let claimed_at = Instant::now();
        for job in claimed {
            let Some(slot) = permit.split(1) else { break };
            let cancel = CancellationToken::new();
            shared.held().insert(job.id, Held { attempt: job.attempts, cancel: cancel.clone() });
            tasks.spawn(run_job(Arc::clone(shared), job, slot, cancel, done.clone(), claimed_at));
        }
        drop(permit);
        if got == 0 && options.exit_when_idle && shared.held().is_empty() {
            return;
        }
        if got < wanted {
            // The queue has nothing more due: wait for a notification or the next poll.
            idle(shared, stop).await;
        }
    }
}

async fn idle(shared: &Shared, stop: &CancellationToken) {
    tokio::select! {
        () = shared.wake.notified() => {}
        () = tokio::time::sleep(shared.options.poll_interval) => {}
        () = stop.cancelled() => {}
    }
}

/// The span of one attempt: a child of the enqueuing request's span when the job carries its
/// `traceparent`, so the request and the work it caused are one trace.
fn job_span(job: &ClaimedJob) -> tracing::Span {
    let span = tracing::info_span!(
        parent: None,
        "job",
        otel.name = %format_args!("job {}", job.kind),
        otel.kind = "consumer",
        otel.status_code = tracing::field::Empty,
        job.id = %job.id,
        job.kind = %job.kind,
        job.attempt = job.attempts,
    );
    if let Some(traceparent) = &job.traceparent {
        breakwater_telemetry::set_parent_from_traceparent(&span, traceparent);
    }
    span
}

async fn run_job(
    shared: Arc<Shared>,
    job: ClaimedJob,
    slot: OwnedSemaphorePermit,
    cancel: CancellationToken,
    done: mpsc::UnboundedSender<Lease>,
    claimed_at: Instant,
) {
    let span = job_span(&job);
    run_attempt(shared, job, slot, cancel, done, claimed_at).instrument(span).await;
}

async fn run_attempt(
    shared: Arc<Shared>,
    job: ClaimedJob,
    _slot: OwnedSemaphorePermit,
    cancel: CancellationToken,
    done: mpsc::UnboundedSender<Lease>,
    claimed_at: Instant,
) {
    let options = &shared.options;
    let lease = job.lease();
    let kind = job.kind.clone();
    let due_to_claim = (job.attempted_at - job.run_at).to_std().unwrap_or_default();
    shared.metrics.started(&kind, due_to_claim, claimed_at.elapsed());

    let outcome = tokio::select! {
        biased;
        () = cancel.cancelled() => None,
        result = tokio::time::timeout(options.job_timeout, shared.handlers.execute(&job)) => Some(
            result.unwrap_or_else(|_| Err(JobError::transient(format!("timed out after {:?}", options.job_timeout))))
        ),
    };
    match outcome {
        Some(Ok(())) => {
            shared.metrics.attempt(&kind, Outcome::Completed);
            // The completer marks it done (batched) and forgets it.
            if done.send(lease).is_err() {
                tracing::error!(job = %job.id, "completer gone; the job will be rescued and run again");
            }
        }
        Some(Err(error)) => {
            tracing::Span::current().record("otel.status_code", "ERROR");
            let delay = options.backoff.next(job.attempts, error.retry_after);
            let state =
                jobs::fail(&shared.pool, &options.owner, lease, &error.message, delay.as_secs_f64(), error.permanent)
                    .await;
            // Not held any more: the heartbeat found the lease lost meanwhile and counted it.
            let still_held = shared.held().remove(&job.id).is_some();
            let outcome = match state {
                Ok(Some(JobState::Dead)) => {
                    Counters::add(&shared.counters.dead, 1);
                    tracing::warn!(job = %job.id, %kind, attempt = job.attempts, error = %error.message, "job dead");
                    Outcome::Dead
                }
                Ok(Some(_)) => {
                    Counters::add(&shared.counters.retried, 1);
                    tracing::info!(job = %job.id, %kind, attempt = job.attempts, error = %error.message, retry_in = ?delay, "job failed; will retry");
                    Outcome::Retried
                }
                Ok(None) => {
                    if still_held {
                        Counters::add(&shared.counters.lease_lost, 1);
                    }
                    Outcome::LeaseLost
                }
                Err(e) => {
                    tracing::error!(job = %job.id, error = %e, "recording a failure failed; the lease will expire and the job be rescued");
                    Outcome::Unrecorded
                }
            };
            shared.metrics.attempt(&kind, outcome);
        }
        // Lease lost (the heartbeat already forgot it) or shutdown (released by `run`).
        None => tracing::info!(job = %job.id, %kind, "job interrupted"),
    }
}

/// Marks finished jobs completed, many per statement: whatever finished while the previous
/// statement ran goes in the next one, so batching adds no delay when the queue is quiet.
async fn complete_loop(shared: Arc<Shared>, mut done: mpsc::UnboundedReceiver<Lease>) {
    let options = &shared.options;
    let mut batch = Vec::with_capacity(COMPLETE_BATCH);
    while done.recv_many(&mut batch, COMPLETE_BATCH).await > 0 {
        let mut wait = Duration::from_millis(50);
        let mut marked = None;
        for attempt in 1..=5 {
            match jobs::complete_many(&shared.pool, &options.owner, &batch).await {
                Ok(n) => {
                    Counters::add(&shared.counters.completed, n);
                    marked = Some(n);
                    break;
                }
                Err(e) if attempt < 5 => {
                    tracing::warn!(error = %e, "marking jobs completed failed; retrying");
                    tokio::time::sleep(wait).await;
                    wait *= 2;
                }
                Err(e) => {
                    tracing::error!(error = %e, jobs = batch.len(), "marking jobs completed failed; they will be rescued and run again");
                }
            }
        }
        let mut held = shared.held();
        let mut still_held = 0_u64;
        for lease in batch.drain(..) {
            still_held += u64::from(held.remove(&lease.id).is_some());
        }
        // Jobs not marked had lost their lease; those the heartbeat had already dropped (and
        // counted) are not held any more, so they are not counted twice.
        if let Some(n) = marked {
            Counters::add(&shared.counters.lease_lost, still_held.saturating_sub(n));
        }
    }
}

/// Extends the leases of every held job; a job whose lease was lost is interrupted at once
/// (another worker may be running it already).
async fn heartbeat_loop(shared: Arc<Shared>, stop: CancellationToken) {
    let options = &shared.options;
    let mut tick = tokio::time::interval(options.heartbeat);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        let leases = shared.leases();
        if leases.is_empty() {
            continue;
        }
        match jobs::heartbeat(&shared.pool, &options.owner, &leases, options.lease.as_secs_f64()).await {
            Ok(kept) => {
                if kept.len() == leases.len() {
                    continue;
                }
                let kept: std::collections::HashSet<Uuid> = kept.into_iter().collect();
                let mut held = shared.held();
                for lease in leases.iter().filter(|l| !kept.contains(&l.id)) {
                    // Only if it is still the same attempt (it may have completed meanwhile).
                    if held.get(&lease.id).is_some_and(|h| h.attempt == lease.attempt)
                        && let Some(lost) = held.remove(&lease.id)
                    {
                        lost.cancel.cancel();
                        Counters::add(&shared.counters.lease_lost, 1);
                        tracing::warn!(job = %lease.id, "lease lost; interrupting the job");
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, "heartbeat failed; leases may expire"),
        }
    }
}

/// `LISTEN breakwater_jobs`: every notification wakes the claim loop. On a lost connection it
/// reconnects; polling covers the gap.
async fn listen_loop(shared: Arc<Shared>, stop: CancellationToken) {
    let mut wait = Duration::from_millis(100);
    while !stop.is_cancelled() {
        let connected = async {
            let mut listener = sqlx::postgres::PgListener::connect_with(&shared.pool).await?;
            listener.listen(jobs::NOTIFY_CHANNEL).await?;
            Ok::<_, sqlx::Error>(listener)
        };
        let mut listener = tokio::select! {
            () = stop.cancelled() => return,
            l = connected => match l {
                Ok(l) => l,
                Err(e) => {
                    tracing::warn!(error = %e, "LISTEN failed; polling until it reconnects");
                    tokio::select! { () = stop.cancelled() => return, () = tokio::time::sleep(wait) => {} }
                    wait = (wait * 2).min(Duration::from_secs(10));
                    continue;
                }
            },
        };
        wait = Duration::from_millis(100);
        // Anything enqueued while we were not listening is found by this claim round.
        shared.wake.notify_one();
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                n = listener.try_recv() => match n {
                    Ok(Some(_)) => shared.wake.notify_one(),
                    // The connection dropped; notifications may have been missed.
                    Ok(None) => shared.wake.notify_one(),
                    Err(e) => {
                        tracing::warn!(error = %e, "LISTEN connection lost");
                        break;
                    }
                },
            }
        }
    }
}

/// Deletes the idempotency keys older than their retention, a batch at a time.
async fn prune_idempotency_keys(shared: &Shared) {
    let retention = shared.options.idempotency_retention.as_secs_f64();
    loop {
        match breakwater_domain::messages::prune_idempotency_keys(&shared.pool, retention, MAINTENANCE_BATCH).await {
            Ok(n) => {
                Counters::add(&shared.counters.keys_pruned, n);
                #[allow(clippy::cast_sign_loss)] // a positive constant
                if n < MAINTENANCE_BATCH as u64 {
                    return;
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "pruning idempotency keys failed");
                return;
            }
        }
    }
}

/// Deletes the live inbox's events past their retention: older than it, or past the newest
/// `stream_keep_per_tenant` of a tenant.
async fn prune_stream_events(shared: &Shared) {
    let o = &shared.options;
    match breakwater_domain::stream::prune(
        &shared.pool,
        o.stream_retention.as_secs_f64(),
        o.stream_keep_per_tenant,
        MAINTENANCE_BATCH,
    )
    .await
    {
        Ok(p) => Counters::add(&shared.counters.stream_events_pruned, p.by_age + p.by_count),
        Err(e) => tracing::warn!(error = %e, "pruning the stream's events failed"),
    }
}

/// Rescues expired leases often (a dead worker's jobs wait at most a lease plus this interval)
/// and prunes finished jobs, old idempotency keys and old stream events now and then. Every worker runs it; `SKIP LOCKED` keeps them apart.
async fn maintenance_loop(shared: Arc<Shared>, stop: CancellationToken) {
    let options = &shared.options;
    let mut rescue = tokio::time::interval(options.rescue_interval);
    let mut prune = tokio::time::interval(options.prune_interval);
    let mut keys = tokio::time::interval(options.prune_interval);
    rescue.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    prune.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    keys.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = rescue.tick() => loop {
                match jobs::rescue(&shared.pool, MAINTENANCE_BATCH).await {
                    Ok(r) => {
                        Counters::add(&shared.counters.rescued, r.requeued + r.dead);
                        if r.requeued + r.dead > 0 {
                            tracing::warn!(requeued = r.requeued, dead = r.dead, "rescued jobs whose lease expired");
                        }
                        if r.requeued > 0 {
                            shared.wake.notify_one();
                        }
                        #[allow(clippy::cast_sign_loss)] // a positive constant
                        if r.requeued + r.dead < MAINTENANCE_BATCH as u64 { break; }
                    }
                    Err(e) => { tracing::warn!(error = %e, "rescue failed"); break; }
                }
            },
            _ = prune.tick() => loop {
                match jobs::prune(
                    &shared.pool,
                    options.completed_retention.as_secs_f64(),
                    options.dead_retention.as_secs_f64(),
                    MAINTENANCE_BATCH,
                ).await {
                    Ok(n) => {
                        Counters::add(&shared.counters.pruned, n);
                        #[allow(clippy::cast_sign_loss)] // a positive constant
                        if n < MAINTENANCE_BATCH as u64 { break; }
                    }
                    Err(e) => { tracing::warn!(error = %e, "pruning failed"); break; }
                }
            },
            _ = keys.tick() => {
                prune_idempotency_keys(&shared).await;
                prune_stream_events(&shared).await;
            }
        }
    }
}
