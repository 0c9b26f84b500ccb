//! The claim loop and the job tasks it spawns: claims due jobs up to the free slots, and runs
//! each attempt in its own task under the job's span, then records how it ended.

use std::sync::Arc;
use std::time::{Duration, Instant};

use breakwater_domain::jobs::{self, ClaimedJob, JobState, Lease};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument as _;

use super::counts::Counters;
use super::{Held, Shared};
use crate::handlers::JobError;
use crate::metrics::Outcome;

/// How long a saturated worker waits for more free slots before claiming (claims stay batched).
const CLAIM_COOLDOWN: Duration = Duration::from_millis(5);

pub(super) async fn claim_loop(
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
